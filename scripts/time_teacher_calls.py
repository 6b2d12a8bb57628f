"""Time warm teacher calls with N query tokens, plus host tensorize+mask, a commit copy and a decode step.

    python scripts/time_teacher_calls.py --config C [--sizes 1,17,65] [--set key=value ...]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    from eagle_ms.bench.calls import add_timing_args, time_step_stages, time_teacher_calls, timing_runner

    p = argparse.ArgumentParser(description=__doc__)
    add_timing_args(p)
    p.add_argument("--sizes", default="1,17,65")
    args = p.parse_args()
    cfg, runner = timing_runner(args)
    sizes = [int(s) for s in args.sizes.split(",")]
    res = time_teacher_calls(runner, sizes, args.repeats, args.context)
    stages = time_step_stages(runner, [s - 1 for s in sizes if s > 1], repeats=args.repeats, context=args.context)
    m = cfg.model
    print(json.dumps({"config": args.config, "overrides": args.set, "layers": m.num_hidden_layers,
                      "hidden": m.hidden_size, "context": args.context, "calls": res,
                      "stages_ms": stages}))


if __name__ == "__main__":
    main()
