"""Reference mode of the device draft tree: the host path's tree from the same draft state, and a
field-by-field comparison that names the first difference (eagle_ms/device_drafter.py makes the device side).

The host path is the reference: ``Eagle3Drafter.propose`` (eagle_ms/drafting.py ``build_tree`` over one
``expand`` call per depth, then ``chain_first``) and eagle_ms/tree.py ``tensorize``. It runs after the
device step, on the same draft cache: the device step already committed the pairs, and the expand calls
write only scratch slots, which the next device step rewrites before reading them.

Equality: every TreeTensors field exactly; scores (float32 sums in the graph, float64 on the host) to
``SCORE_TOL``.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from eagle_ms.device_drafter import DeviceTree, HostTree
from eagle_ms.drafting import TreeParams
from eagle_ms.eagle3_drafter import Eagle3Drafter
from eagle_ms.trace import write_failure_dump
from eagle_ms.tree import DraftTree, TreeTensors, tensorize

__all__ = ["DraftTreeMismatch", "SCORE_TOL", "check_device_tree", "compare_trees", "host_tree", "reference_tree"]

SCORE_TOL = 1e-5
FIELDS = tuple(f.name for f in dataclasses.fields(TreeTensors))


class DraftTreeMismatch(AssertionError):
    """The device tree differs from the host path's. ``dump``: both trees' arrays, the field, the detail;
    ``dump_path``: the JSON written under ``<run_dir>/failures/`` (eagle_ms/trace.py), or None."""

    def __init__(self, message: str, dump: dict, dump_path: Optional[str] = None):
        super().__init__(message)
        self.dump = dump
        self.dump_path = dump_path


def host_tree(tree: DraftTree, length: int, budget: int, max_depth: int) -> HostTree:
    """A host DraftTree as the device step returns it: ``tensorize`` at L' = ``length`` and scores [N]."""
    scores = np.zeros(budget + 1)
    scores[1:tree.num_nodes + 1] = tree.scores
    return HostTree(tensorize(tree, length, budget, max_depth), scores)


def reference_tree(drafter: Eagle3Drafter, length: int, params: TreeParams | None = None) -> HostTree:
    """The host path's tree ``params`` (None: the drafter's own) for the teacher at L' = ``length``, from the
    root pair a device step kept, tensorised at the drafter's max_depth (a shallow tree's tensors too)."""
    drafter.follow_device(length, read_root=True)
    params = drafter.params if params is None else params
    return host_tree(drafter.propose(drafter.root_token, params), length, params.budget, drafter.params.max_depth)


def _first_difference(name: str, got, want) -> Optional[str]:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} != host {want.shape}"
    if name == "scores":
        bad = np.argwhere(~(np.abs(got - want) <= SCORE_TOL))
        what = f"differs by more than {SCORE_TOL}"
    else:
        bad = np.argwhere(got != want)
        what = "differs"
    if not bad.size:
        return None
    at = tuple(int(i) for i in bad[0])
    return f"{what} at {list(at) if at else 'value'}: device {got[at].tolist()} host {want[at].tolist()}"


def compare_trees(device: HostTree, host: HostTree, run_dir: Optional[str] = None) -> None:
    """Raise DraftTreeMismatch naming the first differing field (TreeTensors order, then scores)."""
    pairs = [(name, getattr(device.tensors, name), getattr(host.tensors, name)) for name in FIELDS]
    pairs.append(("scores", device.scores, host.scores))
    for name, got, want in pairs:
        detail = _first_difference(name, got, want)
        if detail is None:
            continue
        dump = {"check": "device_draft_tree", "field": name, "detail": detail,
                "device": _arrays(device), "host": _arrays(host)}
        path = write_failure_dump(run_dir, dump) if run_dir is not None else None
        where = f" (failure dump: {path})" if path else ""
        raise DraftTreeMismatch(f"device draft tree != host path: field '{name}' {detail}{where}", dump, path)


def check_device_tree(drafter: Eagle3Drafter, tree: DeviceTree, run_dir: Optional[str] = None,
                      params: TreeParams | None = None) -> HostTree:
    """Reference mode: the device tree (drafted with ``params``, None: the drafter's own) must equal the
    host path's from the same state; returns it on the host."""
    got = tree.to_host()
    compare_trees(got, reference_tree(drafter, tree.committed_len, params), run_dir)
    return got


def _arrays(tree: HostTree) -> dict:
    out = {name: np.asarray(getattr(tree.tensors, name)).tolist() for name in FIELDS}
    out["scores"] = np.asarray(tree.scores).tolist()
    return out
