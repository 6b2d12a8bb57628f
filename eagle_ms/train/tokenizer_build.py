"""Train a small SentencePiece tokenizer for the demo teacher (and report its statistics).

Choices (see :func:`train_sentencepiece`):
- BPE with ``byte_fallback``: the LLaMA-family SentencePiece recipe openPangu's slow tokenizer
  follows; deterministic greedy merges, any text encodes (unseen characters become byte pieces,
  never ``<unk>``). Unigram would also work; it brings no benefit for a greedy-decoding demo and
  its seed-piece suffix array costs more memory and time on 2 cores.
- ids: ``<unk>`` 0 (also used as pad, as in openPangu), ``<s>`` 1, ``</s>`` 2, then the openPangu
  template pieces as ``user_defined_symbols`` (3..10), so the chat template encodes them atomically.
- ``identity`` normalisation, no whitespace collapsing, no dummy prefix: ``decode(encode(t)) == t``
  for every string (code indentation survives), and a chat turn's content encodes the same way
  alone or inside the rendered chat (no stray ``▁`` after ``：``).
- deterministic: input order fixed, ``shuffle_input_sentence`` off, sentence cap applied here.
"""
from __future__ import annotations

import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import sentencepiece as spm

from eagle_ms.tokenizer import ChatTemplate, Tokenizer, get_template
from eagle_ms.train.data import Conversation

PathLike = Union[str, Path]

#: Pieces of the openPangu chat template, in id order 3..10 of the demo tokenizer.
OPENPANGU_PIECES: Tuple[str, ...] = ("[unused9]", "[unused10]", "系统", "用户", "助手", "工具",
                                     "方法", "：")


@dataclass(frozen=True)
class BuildResult:
    """model_path: the written ``.model``; sentences/chars: training input actually used."""

    model_path: Path
    vocab_size: int
    sentences: int
    chars: int
    seconds: float


@dataclass(frozen=True)
class TokenizerStats:
    """Measured on ``conversations`` (content only for chars/token; the chat template for tokens)."""

    conversations: int
    vocab_size: int
    mean_tokens_per_conversation: float
    chars_per_token: float
    byte_fallback_share: float
    max_tokens: int


def conversation_sentences(conversations: Iterable[Union[Conversation, Sequence[Mapping[str, str]]]],
                           max_sentence_chars: int = 2000) -> Iterator[str]:
    """Message contents split into chunks of at most ``max_sentence_chars`` characters.

    Chunks break after the last newline inside the window (newlines stay in the text, so the
    tokenizer learns ``"\\n"`` pieces), else hard at the limit. Empty contents are
    dropped. Example (limit 8): ``"ab\\ncdefgh\\nij"`` -> ``"ab\\n"``, ``"cdefgh\\n"``, ``"ij"``.
    """
    if max_sentence_chars < 2:
        raise ValueError(f"max_sentence_chars must be >= 2, got {max_sentence_chars}")
    for conv in conversations:
        messages = conv.messages if isinstance(conv, Conversation) else conv
        for msg in messages:
            text = msg["content"]
            while text:
                if len(text) <= max_sentence_chars:
                    yield text
                    break
                cut = text.rfind("\n", 0, max_sentence_chars) + 1 or max_sentence_chars
                yield text[:cut]
                text = text[cut:]


def train_sentencepiece(conversations: Iterable[Union[Conversation, Sequence[Mapping[str, str]]]],
                        out_prefix: PathLike, vocab_size: int = 8000, *,
                        model_type: str = "bpe",
                        user_defined_symbols: Sequence[str] = OPENPANGU_PIECES,
                        max_sentences: int = 1_000_000,
                        max_sentence_chars: int = 2000,
                        character_coverage: float = 0.9995,
                        num_threads: int = 2,
                        verbose: bool = False) -> BuildResult:
    """Train a SentencePiece model on the message contents; writes only ``out_prefix + ".model"``.

    Uses the first ``max_sentences`` chunks of :func:`conversation_sentences` (deterministic).
    ``vocab_size`` must exceed 3 + len(user_defined_symbols) + 256 byte pieces + the number of
    characters kept by ``character_coverage``; SentencePiece raises RuntimeError otherwise.
    Returns a :class:`BuildResult`; the parent directory is created if needed.
    """
    if model_type not in ("bpe", "unigram"):
        raise ValueError(f"model_type must be 'bpe' or 'unigram', got {model_type!r}")
    out_path = Path(f"{out_prefix}.model")
    sentences: List[str] = []
    for text in conversation_sentences(conversations, max_sentence_chars):
        if len(sentences) >= max_sentences:
            break
        sentences.append(text)
    if not sentences:
        raise ValueError("no non-empty message content to train a tokenizer on")
    model = io.BytesIO()
    start = time.perf_counter()
    spm.SentencePieceTrainer.Train(
        sentence_iterator=iter(sentences), model_writer=model,
        vocab_size=vocab_size, model_type=model_type, byte_fallback=True,
        user_defined_symbols=list(user_defined_symbols),
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
        split_digits=True, allow_whitespace_only_pieces=True,
        character_coverage=character_coverage,
        input_sentence_size=len(sentences), shuffle_input_sentence=False,
        max_sentence_length=4 * max_sentence_chars + 16,   # bytes; UTF-8 <= 4 bytes/char
        num_threads=num_threads, minloglevel=0 if verbose else 2)
    seconds = time.perf_counter() - start
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(model.getvalue())
    return BuildResult(model_path=out_path, vocab_size=vocab_size, sentences=len(sentences),
                       chars=sum(map(len, sentences)), seconds=seconds)


def tokenizer_stats(tokenizer: Tokenizer, conversations: Iterable[Conversation],
                    template: Optional[ChatTemplate] = None) -> TokenizerStats:
    """Encode each conversation with ``template`` (default openpangu, no generation prompt).

    chars_per_token and byte_fallback_share are over message contents only (template tokens
    excluded); byte_fallback_share = share of content tokens that are ``<0xNN>`` byte pieces.
    """
    template = template or get_template("openpangu")
    byte_ids = {i for i in range(tokenizer.vocab_size)
                if tokenizer.id_to_token(i).startswith("<0x") and len(tokenizer.id_to_token(i)) == 6}
    n = total_tokens = max_tokens = chars = content_tokens = byte_tokens = 0
    for conv in conversations:
        ids, _ = template.encode_chat(tokenizer, list(conv.messages), add_generation_prompt=False)
        n += 1
        total_tokens += len(ids)
        max_tokens = max(max_tokens, len(ids))
        for msg in conv.messages:
            content_ids = tokenizer.encode(msg["content"])
            chars += len(msg["content"])
            content_tokens += len(content_ids)
            byte_tokens += sum(1 for i in content_ids if i in byte_ids)
    if n == 0:
        raise ValueError("tokenizer_stats needs at least one conversation")
    return TokenizerStats(
        conversations=n, vocab_size=tokenizer.vocab_size,
        mean_tokens_per_conversation=total_tokens / n,
        chars_per_token=chars / max(content_tokens, 1),
        byte_fallback_share=byte_tokens / max(content_tokens, 1), max_tokens=max_tokens)
