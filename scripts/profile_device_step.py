"""Kernel profile of the device step's graphs: the draft tree graph (tree part and whole call), the verify
graph and the decode graph (eagle_ms/bench/device_profile.py; docs/teacher_profile.md).

    python scripts/profile_device_step.py --config configs/demo.yaml [--context 256] [--calls 5] [--json]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _table(res, top: int) -> str:
    lines = []
    for name, k in res.items():
        lines.append(f"{name}: {k['kernels']} kernels, kernel time {k['kernel_ms']:.2f} ms, span {k['span_ms']:.2f} ms "
                     f"(dispatch {k['dispatch_ms']:.2f} ms)")
        lines += [f"  {c['ms']:8.3f} ms  {c['kernels']:4d} kernels  {op}" for op, c in list(k["op_types"].items())[:top]]
    return "\n".join(lines)


def main():
    from eagle_ms.bench.device_profile import profile_device_step
    from eagle_ms.config import load_config
    from eagle_ms.config_yaml import parse_overrides
    from eagle_ms.runtime import setup_context
    from eagle_ms.session import Session

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/demo.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--calls", type=int, default=5, help="profiled calls per graph")
    p.add_argument("--top", type=int, default=12, help="op types listed per graph")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = p.parse_args()
    cfg = load_config(args.config, parse_overrides(args.set + ["speculative.step=device"]))
    setup_context(cfg)
    res = profile_device_step(Session(cfg), args.context, args.calls)
    print(json.dumps(res) if args.json else _table(res, args.top))


if __name__ == "__main__":
    main()
