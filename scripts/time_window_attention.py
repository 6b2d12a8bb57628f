"""Attention over the cache window: the fused in-place kernel against the gathered window, per query-row count
(docs/teacher_profile.md, "Attention over the cache window").

    python scripts/time_window_attention.py [--rows 1,2,4,11,17,33] [--window 512] [--layers 12]
                                            [--repeats 40] [--rounds 3]

One graph per form and N: ``--layers`` KV caches of the demo teacher's shape (Hq 4, Hkv 2, D 64, S 2048),
each written with N new rows (``KVCache.write`` / ``update``) and attended over slots [0, W) by N query rows,
the outputs summed. ``in_place``: ``EagerAttention.over_cache`` (cpu_kernels WindowAttention reads the
cache). ``gathered``: ``KVCache.update``'s window gathers, then ``EagerAttention`` with the 'cpu' kernels (two
batched matmuls around MaskedSoftmax, then the output transpose). Per N: the median wall time of ``--repeats``
warm calls per round, the median over ``--rounds`` alternated rounds, and their ratio. Half of the window's
slots are masked (a context of W/2). Prints one JSON object; run it on an otherwise idle machine.
"""
import argparse
import json

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops

from eagle_ms.models.attention import EagerAttention
from eagle_ms.models.kv_cache import KVCache, flat_rows
from time_kernel_dispatch import median_call_ms  # scripts/: the script's own folder is on sys.path

HEADS, KV_HEADS, HEAD_DIM, CAPACITY = 4, 2, 64, 2048


class CacheAttention(nn.Cell):
    """construct(q [1,Hq,N,D], k, v [1,N,Hkv,D], slots [1,N] int32, mask [1,N,W] bool) -> [1,N,Hq*D]: the sum
    over ``layers`` caches of the attention after writing k, v at ``slots``."""

    def __init__(self, layers: int, in_place: bool):
        super().__init__()
        self.caches = nn.CellList([KVCache(1, KV_HEADS, CAPACITY, HEAD_DIM) for _ in range(layers)])
        self.attn = EagerAttention(HEADS, KV_HEADS, HEAD_DIM, kernels="cpu")
        self.in_place = in_place

    def construct(self, q, k, v, slots, mask):
        rows = flat_rows(slots, KV_HEADS, CAPACITY)
        total = ops.zeros((1, q.shape[2], HEADS * HEAD_DIM), ms.float32)
        for cache in self.caches:
            if self.in_place:
                k_cache, v_cache = cache.write(k, v, rows)
                total = total + self.attn.over_cache(q, k_cache, v_cache, mask)
            else:
                k_win, v_win = cache.update(k, v, rows, mask.shape[-1])
                total = total + self.attn(q, k_win, v_win, mask)
        return total


def inputs(n: int, window: int):
    rng = np.random.default_rng(n)
    context = window // 2
    allowed = np.zeros((1, n, window), bool)
    allowed[:, :, :context] = True
    allowed[0, np.arange(n), context + np.arange(n)] = True  # each new row sees the context and itself
    return (Tensor(rng.standard_normal((1, HEADS, n, HEAD_DIM)).astype(np.float32)),
            Tensor(rng.standard_normal((1, n, KV_HEADS, HEAD_DIM)).astype(np.float32)),
            Tensor(rng.standard_normal((1, n, KV_HEADS, HEAD_DIM)).astype(np.float32)),
            Tensor((context + np.arange(n)).reshape(1, n).astype(np.int32)),
            Tensor(allowed))  # bool: over_cache reads it as is, the gathered form converts it


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,2,4,11,17,33", help="comma-separated query-row counts N")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    sizes = [int(n) for n in args.rows.split(",")]
    cells = {form: CacheAttention(args.layers, form == "in_place") for form in ("in_place", "gathered")}
    data = {n: inputs(n, args.window) for n in sizes}
    for n in sizes:  # compile and check that both forms agree
        a, b = (cells[form](*data[n]).asnumpy() for form in cells)
        if not np.allclose(a, b, rtol=1e-4, atol=1e-5):
            raise SystemExit(f"N={n}: the two forms disagree (max |diff| {np.max(np.abs(a - b)):.3e})")
    rounds = {form: {n: [] for n in sizes} for form in cells}
    for _ in range(args.rounds):
        for n in sizes:
            for form, cell in cells.items():
                rounds[form][n].append(median_call_ms(cell, data[n], args.repeats))
    result = {"window": args.window, "layers": args.layers, "rows": {}}
    for n in sizes:
        in_place, gathered = (float(np.median(rounds[form][n])) for form in ("in_place", "gathered"))
        result["rows"][n] = {"in_place_ms": round(in_place, 3), "gathered_ms": round(gathered, 3),
                             "in_place/gathered": round(in_place / gathered, 3)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
