"""Profile warm teacher calls per query size N: kernel count, per-component kernel time, runtime dispatch,
host-side pieces of a call, the empty-graph floor (eagle_ms/bench/graph_profile.py; docs/teacher_profile.md).

    python scripts/profile_teacher.py --config configs/demo.yaml --sizes 1,17,33 [--calls 10] [--json]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _table(res) -> str:
    lines = []
    for n, r in res.items():
        k, h = r["kernels"], r["host"]
        lines.append(f"N={n} (window {r['width']}): {k['kernels']} kernels, kernel time {k['kernel_ms']:.2f} ms, "
                     f"span {k['span_ms']:.2f} ms (dispatch {k['dispatch_ms']:.2f} ms); empty-graph floor "
                     f"{r['floor_ms']:.2f} ms")
        lines.append("  host: " + ", ".join(f"{name} {ms:.3f} ms" for name, ms in h.items()))
        for title in ("components", "op_types"):
            lines.append(f"  by {title[:-1].replace('_', ' ')}:")
            lines += [f"  {c['ms']:8.3f} ms  {c['kernels']:4d} kernels  {name}" for name, c in k[title].items()]
    return "\n".join(lines)


def main():
    from eagle_ms.bench.calls import add_timing_args, timing_runner
    from eagle_ms.bench.graph_profile import profile_teacher

    p = argparse.ArgumentParser(description=__doc__)
    add_timing_args(p)
    p.add_argument("--sizes", default="1,17,33")
    p.add_argument("--calls", type=int, default=10, help="profiled calls per N")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = p.parse_args()
    _, runner = timing_runner(args)
    res = profile_teacher(runner, [int(s) for s in args.sizes.split(",")], args.calls, args.repeats, args.context)
    print(json.dumps(res) if args.json else _table(res))


if __name__ == "__main__":
    main()
