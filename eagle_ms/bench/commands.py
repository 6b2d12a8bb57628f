"""The benchmark's CLI commands (``eagle-ms bench | sweep | report | trace diff | trace speed``), registered by
``eagle_ms.cli``; thin: argparse -> config/options -> one library call."""
from __future__ import annotations

import argparse
import json
import shlex

from eagle_ms.cli_args import add_config_args, add_decode_flags, config_path, overrides


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", required=True, help="directory holding <dataset>/question.jsonl")
    p.add_argument("--datasets", default="mt_bench,humaneval", help="comma-separated (default: %(default)s)")
    p.add_argument("--limit", type=int, help="first N questions of EACH dataset")
    p.add_argument("--out", required=True, help="run directory (sweep: the sweep directory)")
    add_decode_flags(p, drafts=("test", "eagle3"))
    p.add_argument("--profile", action="store_true",
                   help="finer stage split (mask construction); perturbs timing, not for headline numbers")
    p.add_argument("--verify-apart", action="store_true",
                   help="with speculative.step fused: also decode each turn as the two-call device step (the same "
                        "trees) to time the verify forward apart: t_ver, overhead and efficiency of the fused run")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier run in --out")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run in --out with the same command: finished turns are kept "
                        "(a sweep resumes point by point; an empty --out starts the run)")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.add_argument("--merge-timeout", type=float, default=1800.0,
                   help="rank 0 waits at most this many seconds for the other ranks (default: %(default)s)")
    p.add_argument("--warmup-tokens", type=int, default=8, help="new tokens of the untimed warm-up pair")
    p.add_argument("--rank", type=int, help="manual sharding without msrun (with --world-size)")
    p.add_argument("--world-size", type=int, dest="world_size")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if any turn failed, was skipped or missing, or EA tokens differ from the baseline")


def _command_line(parser: argparse.ArgumentParser, args, name: str) -> str:
    """The command with every option that differs from its default (a reproducible, canonical form)."""
    words = ["eagle-ms", name]
    for action in parser._actions:  # noqa: SLF001 - argparse offers no public list of actions
        if not action.option_strings or action.dest in ("help",):
            continue
        if not hasattr(args, action.dest):  # a SUPPRESS default that was not given
            continue
        value = getattr(args, action.dest)
        if action.default is not argparse.SUPPRESS and (value is None or value == action.default):
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):  # noqa: SLF001
            words.append(flag)
        elif isinstance(value, list):
            for v in value:
                words += [flag, str(v)]
        else:
            words += [flag, "none" if value is None else str(value)]
    return " ".join(shlex.quote(w) for w in words)


def _prepare(args, parser, name: str):
    """(cfg, BenchOptions) with the ranks initialised (msrun) -- the common part of bench and sweep."""
    from eagle_ms.bench.datasets import parse_datasets
    from eagle_ms.bench.distributed import init_ranks
    from eagle_ms.bench.runner import BenchOptions
    from eagle_ms.config import DEVICE_STEPS, load_config
    from eagle_ms.runtime import setup_context

    cfg = load_config(config_path(args), overrides(args))
    if args.profile and cfg.speculative.step in DEVICE_STEPS:
        parser.error(f"--profile times the host's tree-mask construction, and with speculative.step "
                     f"{cfg.speculative.step} the "
                     "masks are built inside the graphs: profile those with scripts/profile_device_step.py "
                     "(kernels per graph) and scripts/time_device_draft.py, or pass --step host")
    if args.verify_apart and (cfg.speculative.step != "fused" or cfg.speculative.draft != "eagle3"):
        parser.error(f"--verify-apart times the verify forward of a fused step apart: it needs --step fused and "
                     f"--draft eagle3 (got step {cfg.speculative.step}, draft {cfg.speculative.draft}); the "
                     "host and device steps time their verify stage anyway")
    if args.resume and args.overwrite:
        parser.error("--resume keeps the run in --out and --overwrite replaces it: give one")
    setup_context(cfg)
    rank, world = init_ranks(args.rank, args.world_size)
    opts = BenchOptions(data_dir=args.data_dir, out=args.out, datasets=parse_datasets(args.datasets),
                        limit=args.limit, profile=args.profile, progress=not args.no_progress,
                        overwrite=args.overwrite, resume=args.resume, merge_timeout_s=args.merge_timeout,
                        warmup_tokens=args.warmup_tokens, rank=rank, world_size=world, verify_apart=args.verify_apart,
                        command=_command_line(parser, args, name))
    return cfg, opts


def _strict_status(summary: dict) -> int:
    t = summary["turns"]
    bad = t["failed"] or t["skipped"] or t["missing"] or summary["exactness"]["identical"] != t["ok"]
    return 1 if bad else 0


def cmd_bench(args, parser) -> int:
    from eagle_ms.bench.runner import run_bench

    cfg, opts = _prepare(args, parser, "bench")
    summary = run_bench(cfg, opts)  # an existing or busy --out: OSError, reported by eagle_ms.cli.main
    if summary is None:  # ranks > 0: rank 0 reports
        return 0
    print(headline(summary, opts.out))
    return _strict_status(summary) if args.strict else 0


def cmd_sweep(args, parser) -> int:
    from eagle_ms.bench.sweep import parse_int_list, parse_windows, plan_sweeps, run_sweep

    budgets = parse_int_list(args.budgets, "--budgets") if args.budgets else None
    depths = parse_int_list(args.depths, "--depths") if args.depths else None
    windows = parse_windows(args.windows) if args.windows else None
    cfg, opts = _prepare(args, parser, "sweep")
    sweeps = plan_sweeps(cfg.speculative.budget, cfg.speculative.max_depth, budgets, depths, windows, args.preset)
    data = run_sweep(cfg, sweeps, opts, command=opts.command)
    if data is not None:
        print(f"sweep written to {opts.out}/sweep.md ({sum(len(r['rows']) for r in data['results'])} rows)")
    return 0


def cmd_report(args) -> int:
    import os

    from eagle_ms.bench.summary import write_report
    from eagle_ms.bench.sweep import SWEEP_FILE, write_sweep_report

    if os.path.exists(os.path.join(args.run_dir, SWEEP_FILE)):
        write_sweep_report(args.run_dir)
        print(f"rewrote {args.run_dir}/sweep.md, sweep.json and every point's summary")
        return 0
    if not os.path.isdir(args.run_dir):
        raise FileNotFoundError(f"run directory not found: {args.run_dir}")
    summary = write_report(args.run_dir, plots=not args.no_plots)
    print(headline(summary, args.run_dir))
    return 0


def cmd_trace_diff(args) -> int:
    from eagle_ms.trace import diff_runs, format_diff

    rows = diff_runs(args.run_a, args.run_b)
    print(json.dumps(rows, indent=1) if args.json else format_diff(rows, args.run_a, args.run_b))
    same = all(r["in_a"] and r["in_b"] and r["prompt_equal"] and r["ea"]["agree"] and r["baseline"]["agree"]
               for r in rows)
    return 0 if same else 1


def cmd_trace_speed(args) -> int:
    from eagle_ms.bench.speed_compare import compare_speed, format_speed

    result = compare_speed(args.run_before, args.run_after)
    print(json.dumps(result, indent=1) if args.json else format_speed(result))
    return 0


def headline(summary: dict, run_dir: str) -> str:
    t, t1, ex = summary["turns"], summary["table1"], summary["exactness"]
    sp, acc = t1["speedup"], t1["accept_L"]

    def f(v, d=2):
        return "-" if v is None else f"{v:.{d}f}"
    return (f"{t['ok']}/{t['expected']} turns ok ({t['failed']} failed, {t['skipped']} skipped, "
            f"{len(t['missing'])} missing); speedup mean {f(sp['mean'])}x p50 {f(sp['p50'])}x "
            f"p90 {f(sp['p90'])}x p99 {f(sp['p99'])}x; accept_L mean {f(acc['mean'])}; tau {f(summary['tau'])}; "
            f"exact {ex['identical']}/{ex['turns']}\nsummary: {run_dir}/summary.md")


def add_parsers(sub) -> None:
    """Register bench, sweep, report and trace (diff) on the ``eagle-ms`` subparsers."""
    b = sub.add_parser("bench", help="baseline vs speculative decoding over MT-Bench/HumanEval turns")
    add_config_args(b)
    _add_run_args(b)
    b.set_defaults(func=lambda a: cmd_bench(a, b))
    s = sub.add_parser("sweep", help="budget/depth sweep (Table 2, 2-D grids) and draft windows (Table 3)")
    add_config_args(s)
    _add_run_args(s)
    s.add_argument("--budgets", help="comma-separated M values, e.g. 16,32,64,128,256")
    s.add_argument("--depths", help="comma-separated Dmax values, e.g. 4,8,10,12,16")
    s.add_argument("--windows", help="draft windows, e.g. none,128,256,512")
    s.add_argument("--preset", choices=["table2", "table3"], help="the paper's Table 2 grid or Table 3 windows")
    s.set_defaults(func=lambda a: cmd_sweep(a, s))
    r = sub.add_parser("report", help="regenerate summary.json/md and plots of a run (or sweep) from traces")
    r.add_argument("run_dir")
    r.add_argument("--no-plots", action="store_true")
    r.set_defaults(func=cmd_report)
    t = sub.add_parser("trace", help="trace tools")
    tsub = t.add_subparsers(dest="trace_command", required=True)
    d = tsub.add_parser("diff", help="per turn: do two runs' tokens agree, and where do they first diverge")
    d.add_argument("run_a")
    d.add_argument("run_b")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_trace_diff)
    v = tsub.add_parser("speed", help="before/after: per-turn ratios of two runs' baseline and EA tokens/s")
    v.add_argument("run_before")
    v.add_argument("run_after")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_trace_speed)
