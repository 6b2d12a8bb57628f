"""Structural invariants of ``TreeTensors``, checked before verification in reference mode.

Each check returns None or a detail string; they run in order (shapes/dtypes, index range, root, parent
before child, validity closure, depth consistency, canonical padding, ancestor table, reach-root-within-
depth, positions and cache slots, mask == ancestor predicate, paths == root-to-leaf chains), so later
checks may index with arrays that earlier checks proved in range. The first failure raises
``TreeInvariantError`` with a dump of every array, written under ``<run_dir>/failures/`` by the
project's one failure-dump writer (eagle_ms/trace.py ``write_failure_dump``).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from eagle_ms.trace import write_failure_dump
from eagle_ms.tree import TreeInvariantError, TreeTensors, tree_mask

__all__ = ["check_invariants"]

_SCALAR_FIELDS = ("num_paths", "committed_len", "budget", "max_depth")


def _check_shapes(t: TreeTensors) -> Optional[str]:
    for name in _SCALAR_FIELDS:
        value = getattr(t, name)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                or value < 0:
            return f"{name}={value!r} is not a non-negative integer"
    n, d1, p = t.budget + 1, t.max_depth + 1, max(t.budget, 1)
    expected = dict.fromkeys(("tokens", "parent", "depth", "valid", "position_ids",
                              "cache_slots"), (n,))
    expected.update(ancestors=(d1, n), tree_mask=(n, n), paths=(p, d1), path_lengths=(p,))
    for name, shape in expected.items():
        arr = getattr(t, name)
        if not isinstance(arr, np.ndarray) or arr.shape != shape:
            return f"{name} has shape {np.shape(arr)}, expected {shape}"
        kinds = "b" if name in ("valid", "tree_mask") else "iu"
        if arr.dtype.kind not in kinds:
            return f"{name} has dtype {arr.dtype}"
    if t.num_paths > p:
        return f"num_paths={t.num_paths} exceeds the {p} path rows"
    return None


def _check_range(t: TreeTensors) -> Optional[str]:
    n = t.num_nodes
    for name in ("parent", "ancestors", "paths"):
        arr = getattr(t, name)
        bad = np.argwhere((arr < 0) | (arr >= n))
        if bad.size:
            return f"{name}{tuple(bad[0].tolist())} = {arr[tuple(bad[0])]} outside [0, {n})"
    bad = np.flatnonzero(t.tokens < 0)
    return f"tokens[{bad[0]}] = {t.tokens[bad[0]]} is negative" if bad.size else None


def _check_root(t: TreeTensors) -> Optional[str]:
    if not (t.valid[0] and t.parent[0] == 0 and t.depth[0] == 0):
        return (f"root must be valid with parent 0 and depth 0, got valid={bool(t.valid[0])} "
                f"parent={t.parent[0]} depth={t.depth[0]}")
    return None


def _first_bad(mask: np.ndarray, what: str, t: TreeTensors) -> Optional[str]:
    k = np.flatnonzero(mask)[:1]
    return f"node {k[0]}: {what} (parent={t.parent[k[0]]} depth={t.depth[k[0]]} " \
        f"valid={t.valid[k[0]]})" if k.size else None


def _check_parent_order(t: TreeTensors) -> Optional[str]:
    ids = np.arange(t.num_nodes)
    return _first_bad(t.valid & (ids > 0) & (t.parent >= ids), "parent not before child", t)


def _check_validity(t: TreeTensors) -> Optional[str]:
    return _first_bad(t.valid & ~t.valid[t.parent], "valid node with an invalid parent", t)


def _check_depth(t: TreeTensors) -> Optional[str]:
    out = _first_bad((t.depth < 0) | (t.depth > t.max_depth), f"depth > {t.max_depth}", t)
    bad = t.valid & (np.arange(t.num_nodes) > 0) & (t.depth != t.depth[t.parent] + 1)
    return out or _first_bad(bad, "depth != depth[parent] + 1", t)


def _check_padding(t: TreeTensors) -> Optional[str]:
    return _first_bad(~t.valid & ((t.parent != 0) | (t.depth != 0)),
                      "padding must have parent 0 and depth 0", t)


def _check_ancestors(t: TreeTensors) -> Optional[str]:
    a = t.ancestors
    if not np.array_equal(a[0], np.arange(t.num_nodes)):
        return "ancestors[0] != arange(N)"
    bad = np.argwhere(a[1:] != t.parent[a[:-1]])
    return f"ancestors[{bad[0][0] + 1}, {bad[0][1]}] != parent" if bad.size else None


def _check_reach_root(t: TreeTensors) -> Optional[str]:
    ids = np.arange(t.num_nodes)
    return _first_bad(t.valid & (t.ancestors[t.depth, ids] != 0),
                      "does not reach the root in depth steps", t)


def _check_positions(t: TreeTensors) -> Optional[str]:
    L = t.committed_len
    out = _first_bad(t.position_ids != L + t.depth, f"position_ids != {L} + depth", t)
    slots = t.cache_slots != L + np.arange(t.num_nodes)
    return out or _first_bad(slots, f"cache_slots != {L} + node id", t)


def _check_mask(t: TreeTensors) -> Optional[str]:
    bad = np.argwhere(t.tree_mask != tree_mask(t.ancestors, t.valid))
    return f"tree_mask{tuple(bad[0].tolist())} != ancestor predicate" if bad.size else None


def _check_paths(t: TreeTensors) -> Optional[str]:
    has_child = np.zeros(t.num_nodes, bool)
    has_child[t.parent[1:][t.valid[1:]]] = True
    leaves = np.flatnonzero(t.valid & ~has_child)                  # [num_leaves]
    k, rows, lens = t.num_paths, t.paths[:t.num_paths], t.path_lengths[:t.num_paths]
    if leaves.size != k:
        return f"num_paths={k} but the tree has {leaves.size} leaves"
    if np.any(t.paths[k:] != 0) or np.any(t.path_lengths[k:] != 0):
        return "unused path rows must be all 0 with length 0"
    if np.any(lens != t.depth[leaves] + 1):
        return f"path_lengths {lens.tolist()} != leaf depth + 1 {(t.depth[leaves] + 1).tolist()}"
    if np.any(rows[:, 0] != 0) or np.any(rows[np.arange(k), lens - 1] != leaves):
        return f"path rows must run from 0 to the leaves {leaves.tolist()} in ascending order"
    col = np.arange(1, rows.shape[1])[None, :]                     # [1, D]
    chain = (t.parent[rows[:, 1:]] == rows[:, :-1]) | (col >= lens[:, None])
    pad = (rows[:, 1:] == leaves[:, None]) | (col < lens[:, None])
    if not (chain.all() and pad.all()):
        return "a path row is not a parent chain right-padded with its leaf id"
    return None


_CHECKS: tuple = (
    ("shapes", _check_shapes), ("range", _check_range), ("root", _check_root),
    ("parent_before_child", _check_parent_order), ("validity_closure", _check_validity),
    ("depth", _check_depth), ("padding", _check_padding), ("ancestors", _check_ancestors),
    ("reach_root", _check_reach_root), ("positions", _check_positions), ("mask", _check_mask),
    ("paths", _check_paths),
)


def check_invariants(t: TreeTensors, run_dir: Optional[str] = None) -> None:
    """Raise TreeInvariantError (with a dump of every array) at the first failed check.

    Checks, in order: shapes/dtypes, index range, root, parent before child, validity closure,
    depth consistency, canonical padding, ancestor table, reach-root-within-depth, positions and
    cache slots, mask == ancestor predicate, paths == root-to-leaf chains. With `run_dir`, the
    dump is also written to `<run_dir>/failures/tree-*.json` and its path put in the message.
    """
    for name, check in _CHECKS:
        try:
            detail = check(t)
        except (IndexError, TypeError, ValueError) as exc:  # malformed input reached a check
            detail = f"check raised {type(exc).__name__}: {exc}"
        if detail is None:
            continue
        dump = {f.name: np.asarray(getattr(t, f.name, None)).tolist()
                for f in dataclasses.fields(TreeTensors)}
        dump.update(check=name, detail=detail)
        path = write_failure_dump(run_dir, dump) if run_dir is not None else None
        where = f" (failure dump: {path})" if path else ""
        raise TreeInvariantError(f"tree invariant '{name}' failed: {detail}{where}", dump, path)
