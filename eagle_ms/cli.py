"""``eagle-ms <command>``: thin argparse -> config -> one library call."""
from __future__ import annotations

import argparse
import json
import os
import sys

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "demo.yaml")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=DEFAULT_CONFIG, help="MindFormers-style YAML (default: %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set runtime.seq_length=1024 (repeatable)")


def _overrides(args) -> dict:
    """Dotted overrides from --set and from the explicit flags that mirror config keys."""
    from eagle_ms.config import parse_overrides

    out = parse_overrides(args.set)
    flag_keys = {"seed": "runtime.seed", "max_new_tokens": "generation.max_new_tokens", "draft": "speculative.draft",
                 "budget": "speculative.budget", "max_depth": "speculative.max_depth", "top_k": "speculative.top_k",
                 "mode": "speculative.mode", "draft_path": "speculative.draft_path",
                 "min_path_prob": "speculative.min_path_prob", "fallback_accept": "speculative.fallback_accept"}
    for flag, key in flag_keys.items():
        value = getattr(args, flag, None)
        if value is not None:
            out[key] = value
    return out


def _encode_prompt(tokenizer, template, args) -> list[int]:
    if args.prompt_ids:
        return [int(x) for x in args.prompt_ids.split(",") if x.strip()]
    if tokenizer is None:
        raise SystemExit("this config has no tokenizer.model_file: pass --prompt-ids 1,2,3 instead of --prompt")
    if args.raw:
        return [tokenizer.bos_id] + tokenizer.encode(args.prompt)
    return template.encode_chat(tokenizer, [{"role": "user", "content": args.prompt}], True).ids


def cmd_generate(args) -> int:
    from eagle_ms.config import load_config
    from eagle_ms.runtime import setup_context
    from eagle_ms.session import Session

    cfg = load_config(args.config, _overrides(args))
    setup_context(cfg)
    session = Session(cfg, run_dir=args.run_dir)
    prompt = _encode_prompt(session.tokenizer, session.template, args)
    report = session.generate(prompt, warm_up=not args.no_warmup)
    text = session.tokenizer.decode(report["tokens"]) if session.tokenizer else None
    report = {"prompt_tokens": report.pop("prompt_tokens"), **report, "text": text}
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        if text is not None:
            print(text)
        print(f"[{len(report['tokens'])} tokens, {report['tokens_per_s']:.1f} tokens/s, draft={cfg.speculative.draft}, "
              f"mode={report['mode']}, stop={report['stop_reason']}"
              + (f", tau={report['tau']:.2f}" if cfg.speculative.draft != "none" else "") + "]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle-ms", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="greedy generation, teacher-only or speculative")
    _add_config_args(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="user message (rendered with the chat template unless --raw)")
    src.add_argument("--prompt-ids", help="comma-separated token ids, used as they are")
    g.add_argument("--raw", action="store_true", help="encode --prompt without the chat template")
    g.add_argument("--max-new-tokens", type=int, dest="max_new_tokens")
    g.add_argument("--seed", type=int, help="seed of random weights (when no checkpoint) and of the test drafter")
    g.add_argument("--draft", choices=["none", "test", "eagle3"])
    g.add_argument("--draft-path", dest="draft_path")
    g.add_argument("--budget", type=int, help="M: draft nodes per verify")
    g.add_argument("--max-depth", type=int, dest="max_depth", help="Dmax: tree depth bound")
    g.add_argument("--top-k", type=int, dest="top_k")
    g.add_argument("--min-path-prob", type=float, dest="min_path_prob", help="eagle3 depth cut (speculative.min_path_prob)")
    g.add_argument("--fallback-accept", type=float, dest="fallback_accept",
                   help="teacher-only steps while mean accept_L is below this (speculative.fallback_accept)")
    g.add_argument("--mode", choices=["reference", "performance"])
    g.add_argument("--no-warmup", action="store_true", help="time the first call too (includes graph compile)")
    g.add_argument("--run-dir", help="write failure dumps (malformed trees, invariant failures) under RUN_DIR/failures")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_generate)
    from eagle_ms.bench.commands import add_parsers as add_bench_parsers  # bench, sweep, report, trace diff

    add_bench_parsers(sub, _add_config_args, _overrides)
    from eagle_ms.train.commands import add_parsers as add_train_data_parsers  # regenerate, preprocess, build-vocab, train-draft

    add_train_data_parsers(sub, _add_config_args, _overrides)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"eagle-ms {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
