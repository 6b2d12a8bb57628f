"""Draft cost per depth step and per whole tree vs one teacher decode step, side by side in one process.

    python scripts/time_draft.py --config configs/tiny.yaml --set model.checkpoint=null \
        [--budget 16] [--max-depth 10] [--top-k 4,10] [--draft-path P] [--repeats 30] [--context 256]

Without ``--draft-path`` the draft is seeded random weights shaped like one teacher layer (full vocabulary).
Prints one JSON object (medians / p90 in ms; ``x_teacher_decode`` = median over the teacher decode median).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    from eagle_ms.bench.calls import add_timing_args, timing_runner

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_timing_args(p)
    p.add_argument("--budget", type=int, default=16)
    p.add_argument("--max-depth", type=int, default=10)
    p.add_argument("--top-k", default="4,10")
    p.add_argument("--draft-path", default=None)
    p.add_argument("--draft-seed", type=int, default=0)
    p.add_argument("--min-path-prob", type=float, default=0.0, help="depth cut of the 'draft_tree' timing")
    args = p.parse_args()
    from eagle_ms.bench.draft_timing import time_draft
    from eagle_ms.draft_weights import default_draft_config, load_draft_checkpoint, random_draft_state
    from eagle_ms.runtime import eagle3_drafter_from_state

    cfg, runner = timing_runner(args)
    if args.draft_path:
        draft_cfg, state = load_draft_checkpoint(args.draft_path, cfg.model)
    else:
        draft_cfg = default_draft_config(cfg.model)
        state = random_draft_state(draft_cfg, args.draft_seed)
    ks = [int(k) for k in args.top_k.split(",")]
    drafters = {k: eagle3_drafter_from_state(runner, draft_cfg, state, args.budget, args.max_depth, k,
                                              min_path_prob=args.min_path_prob) for k in ks}
    res = time_draft(runner, drafters, args.repeats, args.context)
    m = cfg.model
    print(json.dumps({"config": args.config, "overrides": args.set, "layers": m.num_hidden_layers,
                      "hidden": m.hidden_size, "vocab": m.vocab_size, "draft_vocab": draft_cfg.draft_vocab_size,
                      "context": args.context, "budget": args.budget, "max_depth": args.max_depth,
                      "repeats": args.repeats, **res}))


if __name__ == "__main__":
    main()
