"""``eagle-ms <command>``: thin argparse -> config -> one library call."""
from __future__ import annotations

import argparse
import json
import sys

from eagle_ms.cli_args import add_config_args, add_decode_flags, config_path, overrides
from eagle_ms.token_ids import parse_token_ids

def _encode_prompt(tokenizer, template, args) -> list[int]:
    if args.prompt_ids is not None:
        return parse_token_ids(args.prompt_ids)
    if tokenizer is None:
        raise SystemExit("this config has no tokenizer.model_file: pass --prompt-ids 1,2,3 instead of --prompt")
    if args.raw:
        return [tokenizer.bos_id] + tokenizer.encode(args.prompt)
    return template.encode_chat(tokenizer, [{"role": "user", "content": args.prompt}], True).ids


def cmd_generate(args) -> int:
    from eagle_ms.config import load_config
    from eagle_ms.runtime import setup_context
    from eagle_ms.session import Session

    cfg = load_config(config_path(args), overrides(args))
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
              + (f", tau={report['tau']:.2f}" if report["tau"] is not None and cfg.speculative.draft != "none" else "")
              + "]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle-ms", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="greedy generation, teacher-only or speculative")
    add_config_args(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="user message (rendered with the chat template unless --raw)")
    src.add_argument("--prompt-ids", help="comma-separated token ids, used as they are")
    g.add_argument("--raw", action="store_true", help="encode --prompt without the chat template")
    add_decode_flags(g)
    g.add_argument("--no-warmup", action="store_true", help="time the first call too (includes graph compile)")
    g.add_argument("--run-dir", help="write failure dumps (malformed trees, invariant failures) under RUN_DIR/failures")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_generate)
    from eagle_ms.bench.commands import add_parsers as add_bench_parsers  # bench, sweep, report, trace diff

    add_bench_parsers(sub)
    from eagle_ms.train.commands import add_parsers as add_train_data_parsers  # regenerate, preprocess, build-vocab, train-draft

    add_train_data_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its expected failures -- bad values (ValueError, KeyError) and OS errors naming a
    path (missing, read-only or full output locations, an output another process writes: OSError) --
    are one ``eagle-ms <cmd>: error: ...`` line on stderr and exit code 2, without a traceback."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError, KeyError) as exc:  # OSError messages name the path
        print(f"eagle-ms {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
