"""The device draft tree against the host path on real speculative steps (scripts/time_device_draft.py).

A real generation runs with the host path drafting (``Eagle3Drafter``). At every step the draft's state
(its KV cache and the stored root pair) is snapshotted before the draft work, and every arm runs from
it, in an order rotated per step, with the state restored in between:

  device       one DraftTreeStep call: the extend of the accepted pairs + the whole tree (all depths);
               ends when its small output (num_paths) reaches the host
  host         Eagle3Drafter.observe + propose with the exact early stop (what generation does today)
  host_full    the same without the early stop (all Dmax - 1 expand calls)
  tree_D, tree_1   the device tree part alone (no extend) with Dmax and with 1 depth: their difference
               over Dmax - 1 is the device cost of one expansion depth

The host tree drives the generation, so the run is the host path's; each step also records whether the
device tree equals it (eagle_ms/draft_tree_check.py ``compare_trees``), A, the context L' and the host's
expand calls (how many depths the early stop skipped). Times are wall-clock medians; the machine may be
shared, which is why arms alternate on the same state.
"""
from __future__ import annotations

import time

import numpy as np

from mindspore import Tensor, nn

from eagle_ms.device_drafter import DeviceTreeDrafter, no_step_result
from eagle_ms.draft_tree_check import DraftTreeMismatch, compare_trees, host_tree
from eagle_ms.drafting import TreeParams
from eagle_ms.models.draft_tree_step import DraftTreeStep, result_width

ARMS = ("device", "host", "host_full", "tree_D", "tree_1")


class TreeOnly(nn.Cell):
    """A DraftTreeStep's tree part alone, from the stored root pair: construct(length [1] i32)."""

    def __init__(self, step: DraftTreeStep):
        super().__init__(auto_prefix=False)
        self.step = step

    def construct(self, length):
        store = self.step.draft.root_pair
        return self.step.draft_tree((store.token, store.logprob, store.target_ids, store.hidden), length,
                                    self.step.cache_parameters())


class TimedDrafter:
    """The Drafter protocol of eagle_ms/generate.py over an Eagle3Drafter, timing every arm at each step.

    Needs every step speculative with A <= Dmax (run with ``speculative.fallback_accept=0``)."""

    def __init__(self, drafter):
        self.drafter, self.device = drafter, DeviceTreeDrafter(drafter)
        self.params = drafter.params
        one = TreeParams(self.params.budget, 1, self.params.top_k)
        self.trees = {w: (TreeOnly(self.device.graph(w)),
                          TreeOnly(DraftTreeStep(drafter.draft, one, drafter.context_window,
                                                 drafter.committed_capacity, w)))
                      for w in drafter.attention_windows}
        cache = drafter.draft.midlayer.self_attn.kv_cache
        self.state = [cache.k_cache, cache.v_cache] + [p for _, p in drafter.draft.root_pair.parameters_and_names()]
        self.records: list[dict] = []
        self.pending = None

    def begin(self, prompt_ids, prompt_aux, root: int) -> None:
        self.drafter.begin(prompt_ids, prompt_aux, root)
        self.pending = None

    def observe(self, committed, aux, next_root: int) -> None:
        self.pending = (np.asarray(committed), np.asarray(aux, np.float32), int(next_root))

    def propose(self, root: int):
        d, start = self.params.max_depth, self.drafter.length
        accepted = -1 if self.pending is None else self.pending[0].size - 1
        if accepted > d:
            raise ValueError(f"{accepted + 1} tokens observed at once: run with speculative.fallback_accept=0")
        result, aux = self._device_inputs(accepted)
        saved = [p.asnumpy().copy() for p in self.state]
        outcome, times = {}, {}
        order = ARMS[len(self.records) % len(ARMS):] + ARMS[:len(self.records) % len(ARMS)]
        for arm in order:
            for param, value in zip(self.state, saved):
                param.set_data(Tensor(value))
            t0 = time.perf_counter()
            outcome[arm] = self._run(arm, root, result, aux, start, accepted)
            times[arm] = time.perf_counter() - t0
        length = start + accepted + 1
        self.drafter.follow_device(length, read_root=True)  # every arm left the same committed state
        tree, calls = outcome["host"]
        record = {"context": length, "accepted": accepted, "expand_calls": calls, "equal": True, "detail": None,
                  **{f"{arm}_ms": 1e3 * t for arm, t in times.items()}}
        want = host_tree(tree, length, self.params.budget, d)
        try:
            compare_trees(outcome["device"].to_host(), want)
        except DraftTreeMismatch as exc:
            record.update(equal=False, detail=str(exc))
        self.records.append(record)
        self.pending = None
        return tree

    def _device_inputs(self, accepted: int):
        d = self.params.max_depth
        aux = np.zeros((1, d + 1, 3 * self.drafter.draft.config.target_hidden_size), np.float32)
        if accepted < 0:
            return no_step_result(d), aux
        committed, feats, bonus = self.pending
        result = np.zeros((1, result_width(d)), np.int32)
        result[0, 0] = accepted
        result[0, 1:accepted + 2] = np.append(committed[1:], bonus)
        aux[0, :accepted + 1] = feats
        return result, aux

    def _run(self, arm: str, root: int, result, aux, start: int, accepted: int):
        drafter = self.drafter
        if arm == "device":
            tree = self.device.step(Tensor(result), Tensor(aux), start, accepted)
            tree.num_paths.asnumpy()
            return tree
        if arm.startswith("tree"):
            length = start + accepted + 1
            cell = self.trees[self.device.window(length)][arm == "tree_1"]
            return cell(Tensor(np.array([length], np.int32)))[10].asnumpy()
        drafter.follow_device(start, read_root=True)  # the root pair of the state before the step
        if self.pending is not None:
            drafter.observe(*self.pending)
        drafter.early_stop = arm == "host"
        try:
            tree = drafter.propose(root)
        finally:
            drafter.early_stop = True
        return tree, drafter.last.expand_calls


def summarize(records: list[dict], windows, max_depth: int) -> dict:
    """Per attention window of the context L': step count, median ms per arm, mean expand calls, the share
    of steps the early stop shortened, device-vs-host mismatches; plus the device cost of one depth."""
    out = {}
    bounds = list(windows)
    for i, w in enumerate(bounds):
        lo = bounds[i - 1] if i else 0
        rows = [r for r in records if lo < r["context"] <= w]
        if not rows:
            continue
        med = {arm: float(np.median([r[f"{arm}_ms"] for r in rows])) for arm in ARMS}
        calls = np.array([r["expand_calls"] for r in rows])
        out[f"context<={w}"] = {
            "steps": len(rows), "median_ms": med,
            "device_depth_ms": (med["tree_D"] - med["tree_1"]) / max(max_depth - 1, 1),
            "host_expand_calls_mean": float(calls.mean()),
            "early_stopped_share": float(np.mean(calls < max_depth - 1)),
            "mismatches": sum(not r["equal"] for r in rows),
            "first_mismatch": next((r["detail"] for r in rows if not r["equal"]), None)}
    return out
