"""``python -m eagle_ms.demo``: teacher-only vs speculative greedy decoding on a few prompts.

Until the trained demo teacher/draft pair ships, this runs the seeded random-weight tiny teacher with
the test drafter (teacher-guided random trees) and says so: the text is meaningless, the point is the
exactness check and the mechanics (tokens/s, tau, speedup).
"""
from __future__ import annotations

import argparse
import os
import sys

from eagle_ms.cli import DEFAULT_CONFIG

PROMPTS = (
    "Compose an engaging travel blog post about a recent trip to Hawaii.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle_ms.demo", description=__doc__)
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args(argv)

    from eagle_ms.config import load_config
    from eagle_ms.runtime import setup_context
    from eagle_ms.session import Session

    cfg = load_config(args.config, {"speculative.draft": "test", "generation.max_new_tokens": args.max_new_tokens})
    setup_context(cfg)
    if cfg.checkpoint is None:
        print(f"NOTE: {os.path.relpath(cfg.source)} has no checkpoint: the teacher has seeded RANDOM weights "
              "(runtime.seed) and the draft is the test drafter; the text is noise, the mechanics are real.")
    session = Session(cfg)
    session.warm_up()
    for prompt in PROMPTS:
        ids = session.template.encode_chat(session.tokenizer, [{"role": "user", "content": prompt}], True).ids
        base = session.run(ids)
        spec = session.run(ids, session.make_drafter(ids))
        same = "identical" if spec.tokens == base.tokens else "DIFFERENT (bug!)"
        print(f"\n### {prompt}\n{session.tokenizer.decode(base.tokens)!r}")
        print(f"teacher-only {base.tokens_per_s:7.1f} tok/s | speculative {spec.tokens_per_s:7.1f} tok/s "
              f"(tau {spec.tau:.2f}, M={cfg.speculative.budget}, Dmax={cfg.speculative.max_depth}) | "
              f"speedup {spec.tokens_per_s / base.tokens_per_s:.2f}x | output {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
