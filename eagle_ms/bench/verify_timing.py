"""Device verify step vs today's host path, warm graphs, alternated in one process (scripts/time_device_verify.py).

Host path of one step (eagle_ms/generate.py today): ``tree.verify_attention_mask`` + ``TeacherRunner.verify``
(logits [N, V] and aux [N, 3H] copied to the host, host argmax) + ``verify.greedy_accept`` +
``BranchCache.commit_by_path``. Device path: ``DeviceVerifier.verify`` (one VerifyStep call, one
[1, 2D+3] int32 read), or ``DeviceVerifier.decode`` (one DecodeStep call) for the root alone. Both
start from the same host TreeTensors and agree (checked before timing); after every call the runner is
rewound to the same L, so every repeat sees the same context.

Trees per context: ``decode`` (the root alone, N = 1), ``in_order`` (budget M; the accepted path is a
chain-first prefix: no copy on the host) and ``out_of_order`` (the teacher's own next token placed at
node 2 of a star, so the accepted node ids are [0, 2]: the host commit runs the CacheMover graph).
"""
from __future__ import annotations

import time

import numpy as np

from eagle_ms.tree import DraftTree, TreeTensors, tensorize, verify_attention_mask
from eagle_ms.verify import greedy_accept


def host_copy_bytes(n: int, vocab: int, aux_width: int, max_depth: int) -> dict:
    """Bytes read back to the host per step (fp32 logits and aux; int32 result). Example: N=33, V=8000,
    3H=768, D=12 -> host path 1 157 376 (33*8000*4 + 33*768*4), device path 108 (27*4)."""
    return {"host_path": 4 * n * (vocab + aux_width), "device_path": 4 * (2 * (max_depth + 1) + 1)}


def _star(root: int, tokens: np.ndarray) -> DraftTree:
    m = tokens.size
    return DraftTree(root, tokens, np.zeros(m, np.int64), -np.arange(1, m + 1, dtype=np.float64))


def probe_trees(runner, budget: int, max_depth: int, root: int, rng) -> dict[str, TreeTensors]:
    """The three trees of the module doc at the runner's committed length (one N = 1 call finds the
    teacher's next token; the runner is rewound after it)."""
    length, vocab = runner.length, runner.vocab_size
    decode = tensorize(_star(root, np.zeros(0, np.int64)), length, 0, max_depth)
    nxt = int(runner.verify(decode).argmax[0])
    runner.rewind(length)
    other = (nxt + 1) % vocab
    tokens = rng.integers(0, vocab, budget)
    tokens[tokens == nxt] = other
    in_order, out_of_order = tokens.copy(), tokens.copy()
    in_order[0] = nxt                       # node 1 accepted: node ids [0, 1]
    out_of_order[:2] = (other, nxt)         # node 2 accepted: node ids [0, 2]
    return {"decode": decode,
            "in_order": tensorize(_star(root, in_order), length, budget, max_depth),
            "out_of_order": tensorize(_star(root, out_of_order), length, budget, max_depth)}


def _host_step(runner, t: TreeTensors):
    allowed = verify_attention_mask(t, runner.attention_width(runner.length + t.num_nodes))
    out = runner.verify(t, allowed)
    acc = greedy_accept(t, out.argmax)
    runner.cache.commit_by_path(acc.node_ids)
    return acc


def time_verify_paths(runner, verifier, budget: int, contexts, repeats: int = 30, seed: int = 0) -> list[dict]:
    """One row per (context, tree): median / p25 / p75 ms of both paths, the accepted path, the bytes."""
    rng = np.random.default_rng(seed)
    rows = []
    for context in contexts:
        runner.prefill(rng.integers(0, runner.vocab_size, context).astype(np.int32))
        length = runner.length
        for kind, t in probe_trees(runner, budget, verifier.max_depth, int(rng.integers(0, 100)), rng).items():
            device = ((lambda: verifier.decode(int(t.tokens[0]))) if t.num_nodes == 1  # the root alone
                      else (lambda: verifier.verify(t)))
            paths = {"host": lambda: _host_step(runner, t), "device": device}
            results = {}
            for name, call in paths.items():  # compile, warm, and check that both paths agree
                for _ in range(2):
                    results[name] = call()
                    runner.rewind(length)
            if results["host"].tokens.tolist() != results["device"].tokens.tolist():
                raise AssertionError(f"context {context} {kind}: host tokens {results['host'].tokens.tolist()} "
                                     f"!= device tokens {results['device'].tokens.tolist()}")
            times = {name: [] for name in paths}
            for i in range(repeats):
                for name in (("host", "device") if i % 2 == 0 else ("device", "host")):
                    t0 = time.perf_counter()
                    paths[name]()
                    times[name].append(1e3 * (time.perf_counter() - t0))
                    runner.rewind(length)
            row = {"context": context, "tree": kind, "N": t.num_nodes,
                   "window": runner.attention_width(length + t.num_nodes),
                   "node_ids": results["device"].node_ids.tolist(),
                   "bytes": host_copy_bytes(t.num_nodes, runner.vocab_size, _aux_width(runner), verifier.max_depth)}
            for name, ms_list in times.items():
                row[f"{name}_ms"] = {q: round(float(np.percentile(ms_list, p)), 3)
                                     for q, p in (("p25", 25), ("median", 50), ("p75", 75))}
            rows.append(row)
    return rows


def _aux_width(runner) -> int:
    cfg = runner.model.config
    return len(cfg.aux_layer_ids) * cfg.hidden_size


def time_cells(cells: dict, inputs: dict, repeats: int = 30) -> dict:
    """Median ms of each cell (e.g. commit variants of VerifyStep) on each input tuple, round-robin.

    ``cells`` {name: Cell}, ``inputs`` {label: tuple of Tensors}; each call reads its first output back.
    Returns {name: {label: median_ms}}."""
    for cell in cells.values():
        for args in inputs.values():
            cell(*args)[0].asnumpy()
    times = {(n, k): [] for n in cells for k in inputs}
    for _ in range(repeats):
        for name, cell in cells.items():
            for label, args in inputs.items():
                t0 = time.perf_counter()
                cell(*args)[0].asnumpy()
                times[(name, label)].append(1e3 * (time.perf_counter() - t0))
    return {n: {k: round(float(np.median(times[(n, k)])), 3) for k in inputs} for n in cells}
