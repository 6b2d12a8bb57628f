"""Device draft tree (one DraftTreeStep call) vs the host path (observe + propose) on real demo steps.

    python scripts/time_device_draft.py --out runs/device_draft.jsonl [--config configs/demo.yaml] \
        [--contexts 64,400,900,1800] [--prompts 2] [--new-tokens 48] [--data-dir ../shared/data] [--set K=V]
    python scripts/time_device_draft.py --summarize runs/device_draft.jsonl

For each target context c, ``--prompts`` user messages of ~c tokens (question texts of the data files,
joined and cut) are generated greedily with the low-acceptance fallback off (every step speculative);
eagle_ms/bench/device_draft_timing.py times every arm at each step from the same draft state. Each step's
record is appended to ``--out`` as it is made (runs can be split over several processes, one context
each); the summary (per attention window: median ms per arm, the device cost of one depth, the host's
expand calls, device-vs-host mismatches) is printed as JSON at the end, or from the file by --summarize.
Only the draft graphs of the windows a run can reach are compiled before timing.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def prompts_of(session, data_dir: str, context: int, count: int):
    """``count`` chat prompts of about ``context`` tokens: question texts joined, cut, rotated per prompt."""
    import numpy as np

    from eagle_ms.bench.datasets import load_questions

    text = "\n\n".join(t for q in load_questions(data_dir) for t in q.turns)
    ids = session.tokenizer.encode(text)
    out = []
    for i in range(count):
        start = (i * 997) % max(len(ids) - context, 1)
        body = session.tokenizer.decode(ids[start:start + max(context - 24, 8)])
        msg = [{"role": "user", "content": body}]
        out.append(np.asarray(session.template.encode_chat(session.tokenizer, msg, True).ids, np.int32))
    return out


def reachable_windows(windows, lo: int, hi: int) -> list[int]:
    """The attention windows a context in [lo, hi] uses. Example: (256, 512, 2048), 300..600 -> [512, 2048]."""
    out, prev = [], 0
    for w in windows:
        if lo <= w and hi > prev:
            out.append(w)
        prev = w
    return out


def main():
    from eagle_ms.demo import default_data_dir

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/demo.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--contexts", default="64,400,900,1800")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", help="JSONL file the step records are appended to")
    p.add_argument("--summarize", metavar="JSONL", help="only print the summary of a records file")
    args = p.parse_args()
    from eagle_ms.bench.device_draft_timing import summarize
    from eagle_ms.config import load_config
    from eagle_ms.config_yaml import parse_overrides

    overrides = args.set + ["speculative.fallback_accept=0", f"generation.max_new_tokens={args.new_tokens}"]
    cfg = load_config(args.config, parse_overrides(overrides))
    spec, windows = cfg.speculative, (cfg.runtime.attention_windows or ()) + (cfg.runtime.seq_length,)
    if args.summarize:
        with open(args.summarize, encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
    else:
        if not args.out:
            p.error("--out is required unless --summarize is given")
        records = run(cfg, args, args.data_dir or default_data_dir())
    print(json.dumps({"config": args.config, "budget": spec.budget, "max_depth": spec.max_depth, "top_k": spec.top_k,
                      "steps": len(records), "summary": summarize(records, windows, spec.max_depth)}))


def run(cfg, args, data_dir: str) -> list[dict]:
    """Generate every prompt with the timed drafter, appending each step's record to ``args.out``."""
    import numpy as np

    from mindspore import Tensor

    from eagle_ms.bench.device_draft_timing import TimedDrafter
    from eagle_ms.runtime import setup_context
    from eagle_ms.session import Session

    setup_context(cfg)
    session = Session(cfg)
    contexts = [int(c) for c in args.contexts.split(",")]
    session.eagle3.warm_up()
    timed = TimedDrafter(session.eagle3)
    extra = args.new_tokens + cfg.speculative.max_depth + 64  # the answer, one step and the chat template
    windows = reachable_windows(session.eagle3.attention_windows, min(contexts), max(contexts) + extra)
    timed.device.warm_up(windows)
    for w in windows:
        for cell in timed.trees[w]:
            cell(Tensor(np.array([w], np.int32)))
    for context in contexts:
        for prompt in prompts_of(session, data_dir, context, args.prompts):
            done = len(timed.records)
            session.run(prompt, timed)
            with open(args.out, "a", encoding="utf-8") as fh:
                for record in timed.records[done:]:
                    fh.write(json.dumps({"prompt_tokens": int(prompt.size), **record}) + "\n")
    return timed.records


if __name__ == "__main__":
    main()
