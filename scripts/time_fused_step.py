"""One fused draft+verify graph against the device step's two graph calls (issue #15 item 3), warm, medians.

    python scripts/time_fused_step.py [--config configs/demo.yaml] [--data-dir ../shared/data] \
        [--contexts 200,900] [--warm-steps 4] [--repeats 10] [--rounds 3] [--set KEY=VALUE ...]

For each context c, a chat prompt of about c tokens (question texts of the data files, as in
scripts/time_device_draft.py) is decoded greedily by the device step for ``--warm-steps`` steps; from that
state eagle_ms/bench/fused_step_timing.py times the two calls of a device step against one FusedTreeStep call
on the same inputs (alternated rounds, ``--repeats`` calls per arm and round) and checks that both return
the same packed result. Prints one JSON object; run it on an otherwise idle machine.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    from eagle_ms.demo import default_data_dir

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/demo.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--contexts", default="200,900")
    p.add_argument("--warm-steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args()
    from eagle_ms.bench.fused_step_timing import fused_vs_two_calls
    from eagle_ms.config import load_config
    from eagle_ms.config_yaml import parse_overrides
    from eagle_ms.runtime import setup_context
    from eagle_ms.session import Session
    from time_device_draft import prompts_of

    overrides = args.set + ["speculative.step=device", "speculative.draft=eagle3", "speculative.fallback_accept=0"]
    cfg = load_config(args.config, parse_overrides(overrides))
    setup_context(cfg)
    session = Session(cfg)
    session.warm_up()
    data_dir = args.data_dir or default_data_dir()
    rows = []
    for context in (int(c) for c in args.contexts.split(",")):
        prompt = prompts_of(session, data_dir, context, 1)[0]
        rows.append({"prompt_tokens": int(prompt.size),
                     **fused_vs_two_calls(session.verifier(session.settings.sampling), session.device_tree, prompt,
                                          args.warm_steps, args.repeats, args.rounds)})
    spec = cfg.speculative
    print(json.dumps({"config": args.config, "budget": spec.budget, "max_depth": spec.max_depth,
                      "top_k": spec.top_k, "repeats": args.repeats, "rounds": args.rounds, "contexts": rows}))


if __name__ == "__main__":
    main()
