"""Micro-benchmark of single teacher calls (N query tokens) on a warm graph.

Reports the median and p90 wall time of ``repeats`` calls per N, all sizes interleaved round-robin in
one process so machine noise hits every size alike. Used for the issue notes ("N=1 and N=17 teacher
call times") and to size demo models.
"""
from __future__ import annotations

import time

import numpy as np

from eagle_ms.tree import DraftTree, tensorize


def add_timing_args(parser) -> None:
    """The options every timing script shares: --config, --set, --repeats, --context."""
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--context", type=int, default=256)


def timing_runner(args):
    """(config, warm-able TeacherRunner) from ``add_timing_args`` options, MindSpore context set."""
    from eagle_ms.config import load_config
    from eagle_ms.config_yaml import parse_overrides
    from eagle_ms.runtime import build_runner, setup_context

    cfg = load_config(args.config, parse_overrides(args.set))
    setup_context(cfg)
    return cfg, build_runner(cfg)


def _chain_tree(root: int, n: int, vocab: int, rng) -> DraftTree:
    """A chain of n-1 random draft tokens (shape is what matters for timing)."""
    m = n - 1
    return DraftTree(root, rng.integers(0, vocab, m), np.arange(m), np.zeros(m))


def time_teacher_calls(runner, sizes, repeats: int = 30, context: int = 256, seed: int = 0) -> dict[int, dict]:
    """{N: {"median_ms", "p90_ms", "repeats"}} for verify calls of N tokens after a ``context``-token prefill."""
    rng = np.random.default_rng(seed)
    vocab = runner.model.config.vocab_size
    prompt = rng.integers(0, vocab, context).astype(np.int32)
    runner.prefill(prompt)
    trees = {n: tensorize(_chain_tree(int(prompt[-1]), n, vocab, rng), runner.length, n - 1, max(n - 1, 1))
             for n in sizes}
    for n in sizes:  # compile + warm
        runner.verify(trees[n])
        runner.verify(trees[n])
    times = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            t0 = time.perf_counter()
            runner.verify(trees[n])
            times[n].append(time.perf_counter() - t0)
    return {n: {"median_ms": 1e3 * float(np.median(t)), "p90_ms": 1e3 * float(np.percentile(t, 90)),
                "repeats": repeats} for n, t in times.items()}


def _random_tree(root: int, m: int, max_depth: int, vocab: int, rng) -> DraftTree:
    """A random connected tree of m nodes with depth <= max_depth (parents precede children)."""
    parents, depth = [], [0]
    for k in range(1, m + 1):
        candidates = [j for j in range(k) if depth[j] < max_depth]
        p = int(rng.choice(candidates))
        parents.append(p)
        depth.append(depth[p] + 1)
    return DraftTree(root, rng.integers(0, vocab, m), np.array(parents), np.zeros(m))


def time_step_stages(runner, budgets, max_depth: int = 10, repeats: int = 30, context: int = 256,
                     seed: int = 0) -> dict:
    """Median ms of tensorize + verify mask (host, per budget), a commit-by-path copy, and a decode step."""
    from eagle_ms.tree import verify_attention_mask

    rng = np.random.default_rng(seed)
    vocab = runner.model.config.vocab_size
    runner.prefill(rng.integers(0, vocab, context).astype(np.int32))
    out = {}
    for m in budgets:
        tree = _random_tree(1, m, max_depth, vocab, rng)
        t = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            verify_attention_mask(tensorize(tree, runner.length, m, max_depth), runner.capacity)
            t.append(time.perf_counter() - t0)
        out[f"tensorize_mask_M{m}_ms"] = 1e3 * float(np.median(t))
    width = runner.cache.width
    src = np.arange(runner.length, runner.length + width, dtype=np.int32)[None]
    from mindspore import Tensor
    runner.cache.mover(Tensor(src[:, ::-1].copy()), Tensor(src))  # compile
    t = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        runner.cache.mover(Tensor(src[:, ::-1].copy()), Tensor(src)).asnumpy()
        t.append(time.perf_counter() - t0)
    out["commit_copy_ms"] = 1e3 * float(np.median(t))
    one = tensorize(DraftTree(1, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)), runner.length, 0, 1)
    runner.verify(one)
    t = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        runner.verify(one)
        t.append(time.perf_counter() - t0)
    out["decode_step_ms"] = 1e3 * float(np.median(t))
    return out
