"""This machine's cost per launched kernel in a warm MindSpore graph (docs/teacher_profile.md, "The dispatch floor").

    python scripts/time_kernel_dispatch.py [--kernels 100,200,400] [--repeats 40] [--rounds 3] [--dispatch-threads N]

Each graph is a chain of K dependent elementwise kernels on a [1, 64] float32 tensor (``x * y + y`` repeated: two
launched kernels each time, and too small for the kernels' own work to matter). A graph with no kernel
gives the fixed cost of a call. Per K: the median wall time of ``--repeats`` warm calls per round (each call
waits for its result), the median over ``--rounds`` alternated rounds, and (t_K - t_0) / K, the cost of one
kernel. Environment switches such as ``MS_DEV_RUNTIME_CONF`` apply as in any MindSpore process. Prints one JSON
object; run it on an otherwise idle machine.
"""
import argparse
import json
import time

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn

MAX_KERNELS = 800  # MindSpore 2.9 refuses deeper unrolled loops ("Exceed function call depth limit")


class KernelChain(nn.Cell):
    """construct(x [1, 64] f32, y [1, 64] f32) -> [1, 64] f32 after ``kernels`` (even) dependent elementwise
    kernels. MindSpore unrolls the loop; beyond about 1 000 kernels it refuses the graph (call depth)."""

    def __init__(self, kernels: int):
        super().__init__()
        self.kernels = kernels

    def construct(self, x, y):
        for _ in range(self.kernels // 2):
            x = x * y + y
        return x


def median_call_ms(cell, inputs, repeats: int) -> float:
    """The median wall time of ``repeats`` warm calls of ``cell(*inputs)``, each read back to the host."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        cell(*inputs).asnumpy()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", default="100,200,400", help="comma-separated chain lengths K")
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dispatch-threads", type=int, default=None,
                   help="mindspore.runtime.dispatch_threads_num (default: MindSpore's own)")
    args = p.parse_args()
    sizes = [int(k) for k in args.kernels.split(",")]
    if any(k < 2 or k % 2 or k > MAX_KERNELS for k in sizes):
        raise SystemExit(f"--kernels {args.kernels!r}: every K must be even, in [2, {MAX_KERNELS}]")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    if args.dispatch_threads is not None:
        ms.runtime.dispatch_threads_num(args.dispatch_threads)
    x = Tensor(np.ones((1, 64), np.float32))
    y = Tensor(np.full((1, 64), 0.5, np.float32))
    cells = {k: KernelChain(k) for k in [0] + sizes}
    for cell in cells.values():  # compile and warm every graph before any timing
        for _ in range(3):
            cell(x, y).asnumpy()
    rounds = {k: [] for k in cells}
    for _ in range(args.rounds):
        for k, cell in cells.items():
            rounds[k].append(median_call_ms(cell, (x, y), args.repeats))
    call_ms = {k: float(np.median(v)) for k, v in rounds.items()}
    print(json.dumps({
        "repeats": args.repeats, "rounds": args.rounds, "dispatch_threads": args.dispatch_threads,
        "empty_graph_ms": call_ms[0],
        "chains": [{"kernels": k, "call_ms": call_ms[k], "us_per_kernel": (call_ms[k] - call_ms[0]) * 1e3 / k}
                   for k in sizes],
    }))


if __name__ == "__main__":
    main()
