"""Device draft tree (one DraftTreeStep call) vs the host path (observe + propose) on real demo steps.

    python scripts/time_device_draft.py [--config configs/demo.yaml] [--contexts 64,400,900,1800] \
        [--prompts 2] [--new-tokens 48] [--data-dir ../shared/data] [--set KEY=VALUE ...]

For each target context c, ``--prompts`` user messages of ~c tokens (question texts of the data files,
joined and cut) are generated greedily with the low-acceptance fallback off (every step speculative);
eagle_ms/bench/device_draft_timing.py times every arm at each step from the same draft state. Prints one
JSON object: the settings, per-window summaries (median ms per arm, the device cost of one depth, the
host's expand calls, device-vs-host mismatches) and every step's record.
"""
import argparse
import json
import os
import sys
import time

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


def main():
    from eagle_ms.demo import default_data_dir

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/demo.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--contexts", default="64,400,900,1800")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args()
    from mindspore import Tensor
    import numpy as np

    from eagle_ms.bench.device_draft_timing import TimedDrafter, summarize
    from eagle_ms.config import load_config
    from eagle_ms.config_yaml import parse_overrides
    from eagle_ms.runtime import setup_context
    from eagle_ms.session import Session

    overrides = args.set + ["speculative.fallback_accept=0", f"generation.max_new_tokens={args.new_tokens}"]
    cfg = load_config(args.config, parse_overrides(overrides))
    setup_context(cfg)
    session = Session(cfg)
    t0 = time.perf_counter()
    session.warm_up()
    timed = TimedDrafter(session.eagle3)
    timed.device.warm_up()
    for w, cells in timed.trees.items():
        for cell in cells:
            cell(Tensor(np.array([w], np.int32)))
    compile_s = time.perf_counter() - t0
    data_dir = args.data_dir or default_data_dir()
    runs = []
    for context in (int(c) for c in args.contexts.split(",")):
        for prompt in prompts_of(session, data_dir, context, args.prompts):
            result = session.run(prompt, timed)
            runs.append({"prompt_tokens": int(prompt.size), "new_tokens": len(result.tokens), "tau": result.tau})
    spec = cfg.speculative
    print(json.dumps({"config": args.config, "budget": spec.budget, "max_depth": spec.max_depth,
                      "top_k": spec.top_k, "warm_up_s": compile_s, "runs": runs,
                      "summary": summarize(timed.records, session.eagle3.attention_windows, spec.max_depth),
                      "records": timed.records}))


if __name__ == "__main__":
    main()
