"""Draft cost vs teacher cost, measured side by side in one process (scripts/time_draft.py).

After a ``context``-token prefill (teacher) and ``begin`` (draft), every repeat times, round-robin so
machine noise hits all alike:

  teacher_decode      one teacher decode step (N = 1 verify graph)
  teacher_verify      one teacher tree verify (N = budget + 1)
  per top_k k:
    draft_depth_step  one depth step of the tree: the k-row ``expand`` call (masks, ancestor
                      bookkeeping, device call, results to host) plus the k^2 -> k host selection
    draft_tree_full   a whole tree with all ``max_depth`` depths (early stop off): the worst case
    draft_tree        a whole tree as generation drafts it (early stop on)
    draft_observe     the fixed-shape extend of one verify's accepted pairs (Dmax+1 rows)

Medians and p90 in milliseconds, plus each median over the teacher decode median.
"""
from __future__ import annotations

import time

import numpy as np

from eagle_ms.drafting import rank_order
from eagle_ms.tree import DraftTree, tensorize


def _stats(samples: list[float], ref: float | None = None) -> dict:
    med = float(np.median(samples)) * 1e3
    out = {"median_ms": med, "p90_ms": float(np.percentile(samples, 90)) * 1e3}
    if ref is not None:
        out["x_teacher_decode"] = med / ref
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _depth_step(drafter) -> None:
    """One expand call at depth 2 (ancestor bookkeeping included) + the k^2 -> k host selection.

    Needs a previous expand call's state (``drafter._prev``); writes scratch slots only.
    """
    k = drafter.params.top_k
    lp, _ = drafter._expand(2, np.arange(k), np.zeros(k, np.int64))
    scores = (np.zeros((k, 1)) + np.minimum(lp.astype(np.float64), 0.0)).reshape(-1)
    rank_order(scores)[:k]


def time_draft(runner, drafters: dict, repeats: int = 30, context: int = 256, seed: int = 0) -> dict:
    """{"teacher_decode": stats, "teacher_verify": stats, "draft": {k: {name: stats}}, ...}.

    ``drafters``: {top_k: Eagle3Drafter} sharing one budget and max_depth.
    """
    rng = np.random.default_rng(seed)
    vocab = runner.model.config.vocab_size
    prompt = rng.integers(3, vocab, context).astype(np.int32)
    pre = runner.prefill(prompt)
    root = int(pre.argmax[-1])
    params = next(iter(drafters.values())).params
    empty = tensorize(DraftTree(root, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)), runner.length,
                      0, params.max_depth)
    for d in drafters.values():
        d.begin(prompt, pre.aux, root)
    tree = next(iter(drafters.values())).propose(root)
    full = tensorize(tree, runner.length, params.budget, params.max_depth)
    aux1 = pre.aux[-1:]

    def observe(d):
        saved = (d.length, d._root)
        d.observe(np.array([root]), aux1, root)
        d.length, d._root = saved

    def tree_full(d):
        d.early_stop = False
        d.propose(root)
        d.early_stop = True

    jobs = {("teacher", "teacher_decode"): lambda: runner.verify(empty),
            ("teacher", "teacher_verify"): lambda: runner.verify(full)}
    for k, d in drafters.items():
        d._expand(1, np.zeros(k, np.int64), np.zeros(k, np.int64))  # ancestor state for depth steps
        jobs[(k, "draft_depth_step")] = lambda d=d: _depth_step(d)
        jobs[(k, "draft_tree_full")] = lambda d=d: tree_full(d)
        jobs[(k, "draft_tree")] = lambda d=d: d.propose(root)
        jobs[(k, "draft_observe")] = lambda d=d: observe(d)
    for fn in jobs.values():  # compile + warm
        fn()
        fn()
    times = {key: [] for key in jobs}
    for _ in range(repeats):
        for key, fn in jobs.items():
            times[key].append(_timed(fn))
    ref = float(np.median(times[("teacher", "teacher_decode")])) * 1e3
    out = {"teacher_decode": _stats(times[("teacher", "teacher_decode")]),
           f"teacher_verify_N{params.budget + 1}": _stats(times[("teacher", "teacher_verify")], ref),
           "draft": {}}
    for k in drafters:
        out["draft"][f"top_k={k}"] = {
            "draft_depth_step": _stats(times[(k, "draft_depth_step")], ref),
            "draft_tree_full": _stats(times[(k, "draft_tree_full")], ref),
            "draft_tree": _stats(times[(k, "draft_tree")], ref),
            "draft_tree_expand_calls": drafters[k].last.expand_calls,
            "draft_observe": _stats(times[(k, "draft_observe")], ref),
        }
    return out
