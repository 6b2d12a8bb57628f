"""``python -m eagle_ms.demo`` (``bash scripts/demo.sh``): teacher-only vs EAGLE-3 speculative decoding.

Runs the shipped demo pair (``configs/demo.yaml``: the small Pangu-architecture teacher and its EAGLE-3
draft under ``eagle_ms/assets/demo``) on the first user turn of a few MT-Bench and HumanEval questions:
``<data-dir>/{mt_bench,humaneval}/question.jsonl``, by default ``../shared/data`` beside the repository
when present, else the bundled sample ``eagle_ms/assets/demo/sample``. For every prompt it prints the
answer, tokens/s of both runs, tau (mean tokens per verify step) and the speedup, and checks that the
speculative output is token-for-token the teacher-only output (exit status 1 if any differs): greedy
by default; with ``--temperature T`` (and ``--top-p``, ``--sample-top-k``, ``--seed``) both runs sample
with the same position-keyed seed, so they must still agree token for token.

Timing: graphs are compiled first (``Session.warm_up`` plus one untimed pair of short runs); each prompt's
two runs are then timed back to back, so the ratio is measured side by side.
"""
from __future__ import annotations

import argparse
import os
import sys

from eagle_ms.cli_args import SAMPLING_FLAGS, add_config_args, add_decode_flags, config_path, overrides

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(REPO_ROOT), "shared", "data")
SAMPLE_DATA = os.path.join(REPO_ROOT, "eagle_ms", "assets", "demo", "sample")


def default_data_dir() -> str:
    return SHARED_DATA if os.path.isdir(os.path.join(SHARED_DATA, "mt_bench")) else SAMPLE_DATA


def pick_questions(data_dir: str, per_dataset: int):
    """The first ``per_dataset`` questions of MT-Bench and of HumanEval, interleaved."""
    from eagle_ms.bench.datasets import load_questions

    picked = [load_questions(data_dir, [name], limit=per_dataset) for name in ("mt_bench", "humaneval")]
    return [q for pair in zip(*picked) for q in pair]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle_ms.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--data-dir", default=None, help=f"question files (default: {SHARED_DATA} if present, "
                        f"else {SAMPLE_DATA})")
    parser.add_argument("--per-dataset", type=int, default=2, help="questions from each of MT-Bench and HumanEval")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: generation.max_new_tokens")
    add_decode_flags(parser, flags=SAMPLING_FLAGS)
    args = parser.parse_args(argv)

    from eagle_ms.bench.runner import build_prompt
    from eagle_ms.config import load_config
    from eagle_ms.runtime import setup_context
    from eagle_ms.session import Session

    changes = {"speculative.draft": "eagle3", **overrides(args)}
    if args.max_new_tokens is not None:
        changes["generation.max_new_tokens"] = args.max_new_tokens
    cfg = load_config(config_path(args), changes)
    if cfg.checkpoint is None:
        raise SystemExit(f"{config_path(args)}: model.checkpoint is null; the demo needs trained weights "
                         "(configs/demo.yaml ships them)")
    data_dir = args.data_dir or default_data_dir()
    questions = pick_questions(data_dir, args.per_dataset)
    setup_context(cfg)
    session = Session(cfg)
    spec, gen = cfg.speculative, cfg.generation
    choice = "greedy" if gen.sampling.greedy else (f"sampling T={gen.temperature} top-p {gen.top_p} "
                                                    f"top-k {gen.top_k} seed {gen.seed}")
    print(f"teacher {cfg.checkpoint}\ndraft   {spec.draft_path}\nprompts {data_dir} ({len(questions)} questions, "
          f"first turn)\nbudget M={spec.budget} nodes, depth {spec.max_depth}, top-k {spec.top_k}; {choice}; "
          f"max {gen.max_new_tokens} new tokens; compiling...", flush=True)
    first = build_prompt(session, questions[0], 1, [])
    session.warm_up()
    session.untimed_pair(first, session.make_drafter(first), tokens=16)
    speedups, taus, all_same = [], [], True
    for q in questions:
        ids = build_prompt(session, q, 1, [])
        base = session.run(ids)
        ea = session.run(ids, session.make_drafter(ids))
        same = ea.tokens == base.tokens
        all_same &= same
        speedup = ea.tokens_per_s / base.tokens_per_s
        speedups.append(speedup)
        if ea.tau is not None:  # None: the answer ended before the first verify step
            taus.append(ea.tau)
        print(f"\n### {q.dataset} {q.question_id} ({q.category}): {_shorten(q.turns[0])}")
        eos = cfg.model.eos_token_id
        print(session.tokenizer.decode(base.tokens[:-1] if base.tokens[-1:] == [eos] else base.tokens))
        print(f"--> {len(base.tokens)} tokens ({base.stop_reason}) | teacher-only {base.tokens_per_s:6.1f} tok/s | "
              f"EAGLE-3 {ea.tokens_per_s:6.1f} tok/s, tau {'-' if ea.tau is None else f'{ea.tau:.2f}'} | speedup {speedup:.2f}x | "
              f"output {'identical' if same else 'DIFFERENT (bug: please report)'}", flush=True)
    print(f"\nmean speedup {sum(speedups) / len(speedups):.2f}x, mean tau {sum(taus) / max(len(taus), 1):.2f} over "
          f"{len(questions)} prompts; outputs {'all identical' if all_same else 'NOT all identical'} to teacher-only")
    return 0 if all_same else 1


def _shorten(text: str, width: int = 100) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[:width - 3] + "..."


if __name__ == "__main__":
    sys.exit(main())
