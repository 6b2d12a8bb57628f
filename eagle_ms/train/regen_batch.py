"""Batch-B teacher decoding with continuous batching (the engine of ``eagle-ms regenerate``).

The teacher Cell is built for batch B and KV capacity S. Every call has one of two fixed shapes, so a
run compiles exactly two graphs:

* **prefill** ``[B, C]`` (C = ``runtime.prefill_chunk``): rows that still have prompt tokens to feed
  take their next chunk (the last one zero-padded), exactly as ``TeacherRunner.prefill`` does for
  batch 1; the other rows are *idle* for this call;
* **decode** ``[B, 1]``: every decoding row feeds its last chosen token (the "root", not yet in the
  cache) at slot ``L`` and gets the next token; empty rows are idle.

Prefill has priority: while any row has prompt tokens left, decode rows wait (vLLM v0 style). A row
that finishes its answer asks its session for the next prompt (next turn of the same conversation);
a finished conversation leaves the row free. Free rows are refilled from the pending sessions once at
least ``refill_min`` rows are free (or none is busy): a prefill call costs B x C token-forwards however
many rows use it, so refilling rows together rather than one by one cuts the prefill cost of a row up to
B-fold (B=16, prompts of ~150 tokens: prefill was ~80 % of regeneration time with one-by-one refills).
Rows never interact (each has its own mask), so ``refill_min`` changes only the speed, not the output.

Per-row state lives on the host: committed length ``L`` (slots [0, L) valid), tokens still to feed,
generated tokens. Index spaces for row b of a call: RoPE position = cache slot = ``L + i``; the mask
row i allows slots [0, L + i] (``causal_chunk_mask``).

Idle rows must not touch anyone's committed slots, so the last C slots of every row's cache are a
**scratch region** ``[S - C, S)`` that is never committed: an idle row writes its dummy chunk there and
each of its query rows sees only its own scratch slot (no all-masked softmax row, no NaN). So a row's
context (prompt + answer) is limited to ``S - C`` tokens (``max_context``).

Worked example, B=2, C=4, S=16 (scratch = slots 12..15): row 0 prefills a 6-token prompt (chunks
[t0..t3] at slots 0..3, then [t4, t5, 0, 0] at slots 4..7, L=6), while row 1 (decoding at L=9) is idle
in both prefill calls: slots 12..15, mask row i = {12 + i}. Then one decode call: row 0 feeds its first
token at slot 6, row 1 its root at slot 9.

Greedy choice is ``argmax`` of the fp32 logits (first index on ties), as in ``eagle_ms.generate``;
with ``temperature > 0`` the token at position L is ``eagle_ms.sampling.sample_rows`` keyed by (the
session's ``sample_seed``, L), exactly as ``generate`` draws it with that seed, so the result does not
depend on which rows share a batch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import numpy as np

from mindspore import Tensor, ops

from eagle_ms.config import GREEDY, SamplingParams
from eagle_ms.sampling import sample_rows
from eagle_ms.teacher import causal_chunk_mask
from eagle_ms.token_ids import check_token_ids


class TurnSource(Protocol):
    """One conversation being answered turn by turn."""

    sample_seed: int | None  # the sampling seed of this conversation (None: greedy)

    def next_prompt(self) -> np.ndarray | None:
        """Prompt ids [P] of the next turn (P + 1 <= max_context), or None when the conversation is done."""

    def add_answer(self, tokens: list[int], stop: str) -> None:
        """The generated tokens of the current turn and why it stopped (eos | max_new_tokens | capacity)."""


@dataclass
class _Row:
    session: TurnSource
    feed: np.ndarray  # prompt tokens not yet in the cache
    length: int = 0  # committed slots [0, length)
    root: int = -1  # last chosen token, not yet in the cache (decode phase)
    tokens: list[int] = field(default_factory=list)
    stop: str | None = None
    sampling: SamplingParams = GREEDY  # the decoder's parameters with the session's seed


@dataclass
class DecodeStats:
    prefill_calls: int = 0
    decode_calls: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0


class BatchDecoder:
    """Continuous-batching decoding over a teacher Cell built for batch ``model.batch``."""

    def __init__(self, model, prefill_chunk: int, max_new_tokens: int, stop_ids, sampling: SamplingParams = GREEDY,
                 refill_min: int = 1):
        self.model = model
        self.batch, self.capacity, self.chunk = model.batch, model.capacity, prefill_chunk
        self.vocab_size = model.config.vocab_size
        if prefill_chunk < 1 or 2 * prefill_chunk >= self.capacity:
            raise ValueError(f"prefill_chunk {prefill_chunk} leaves no room in a KV cache of {self.capacity} slots: "
                             f"need 2 * prefill_chunk < runtime.seq_length (the last chunk is a scratch region)")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not 1 <= refill_min <= model.batch:
            raise ValueError(f"refill_min must be in [1, batch size {model.batch}], got {refill_min}")
        self.refill_min = refill_min
        self.max_new_tokens = max_new_tokens
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.sampling = sampling  # seed replaced by each session's sample_seed
        self.scratch = self.capacity - prefill_chunk  # first scratch slot
        self.stats = DecodeStats()

    @property
    def max_context(self) -> int:
        """Prompt + answer tokens a row can hold (committed slots never reach the scratch region)."""
        return self.scratch

    # ------------------------------------------------------------------ scheduling
    def run(self, sessions: Iterator[TurnSource], on_finished: Callable[[TurnSource], None]) -> DecodeStats:
        """Answer every turn of every session; ``on_finished(session)`` as each conversation completes."""
        rows: list[_Row | None] = [None] * self.batch
        pending = iter(sessions)
        exhausted = False
        while True:
            free = [b for b, row in enumerate(rows) if row is None]
            if not exhausted and free and (len(free) >= self.refill_min or len(free) == self.batch):
                for b in free:
                    if not exhausted:
                        rows[b], exhausted = self._start(pending, on_finished)
            if all(r is None for r in rows):
                return self.stats
            if any(r is not None and r.feed.size for r in rows):
                self._prefill_step(rows)
            else:
                self._decode_step(rows)
            for b, row in enumerate(rows):
                if row is not None and row.stop is not None:
                    rows[b] = self._next_turn(row, on_finished)

    def _start(self, pending: Iterator[TurnSource], on_finished) -> tuple[_Row | None, bool]:
        """A row for the next session that has a prompt; (None, True) when no session is left."""
        for session in pending:
            prompt = session.next_prompt()
            if prompt is None:
                on_finished(session)
                continue
            return self._row(session, prompt), False
        return None, True

    def _next_turn(self, row: _Row, on_finished) -> _Row | None:
        row.session.add_answer(row.tokens, row.stop)
        self.stats.generated_tokens += len(row.tokens)
        prompt = row.session.next_prompt()
        if prompt is None:
            on_finished(row.session)
            return None
        return self._row(row.session, prompt)

    def _row(self, session: TurnSource, prompt) -> _Row:
        prompt = check_token_ids(prompt, self.vocab_size)
        if prompt.ndim != 1 or prompt.size < 1 or prompt.size + 1 > self.max_context:
            raise ValueError(f"prompt of {prompt.size} tokens does not fit max_context {self.max_context} "
                             f"(runtime.seq_length {self.capacity} - prefill_chunk {self.chunk} scratch slots)")
        self.stats.prompt_tokens += int(prompt.size)
        sampling = GREEDY if self.sampling.greedy or session.sample_seed is None else \
            dataclasses.replace(self.sampling, seed=session.sample_seed)
        return _Row(session, prompt, sampling=sampling)  # a fresh prefill from slot 0: stale slots are masked out

    # ------------------------------------------------------------------ the two fixed-shape calls
    def _idle(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots [n] and mask [n, S] of an idle row: scratch slots, each query sees only itself."""
        slots = self.scratch + np.arange(n, dtype=np.int32)
        allowed = np.zeros((n, self.capacity), dtype=bool)
        allowed[np.arange(n), slots] = True
        return slots, allowed

    def _call(self, ids, slots, allowed, pick_rows, pick_cols) -> np.ndarray:
        """One teacher call; returns the fp32 logits [len(pick_rows), V] at (row, column) pairs only."""
        logits, _ = self.model(Tensor(ids), Tensor(slots), Tensor(slots), Tensor(allowed))
        index = Tensor(np.stack([pick_rows, pick_cols], axis=1).astype(np.int32))
        return ops.gather_nd(logits, index).asnumpy()  # gathered on device: never ship [B, C, V] to the host

    def _prefill_step(self, rows: list[_Row | None]) -> None:
        c, b_all = self.chunk, self.batch
        ids = np.zeros((b_all, c), np.int32)
        slots = np.zeros((b_all, c), np.int32)
        allowed = np.zeros((b_all, c, self.capacity), bool)
        active = []
        for b, row in enumerate(rows):
            if row is not None and row.feed.size:
                real = row.feed[:c]
                ids[b, :real.size] = real
                slots[b] = row.length + np.arange(c, dtype=np.int32)
                allowed[b] = causal_chunk_mask(row.length, c, self.capacity)
                active.append((b, real.size))
            else:
                slots[b], allowed[b] = self._idle(c)
        picked = self._call(ids, slots, allowed, np.array([b for b, _ in active]), np.array([n - 1 for _, n in active]))
        self.stats.prefill_calls += 1
        for (b, n), logits in zip(active, picked):
            row = rows[b]
            row.length += n
            row.feed = row.feed[n:]
            if not row.feed.size:  # prompt done: the last prompt token's logits give the first answer token
                self._emit(row, self._choose(logits, row))

    def _decode_step(self, rows: list[_Row | None]) -> None:
        ids = np.zeros((self.batch, 1), np.int32)
        slots = np.zeros((self.batch, 1), np.int32)
        allowed = np.zeros((self.batch, 1, self.capacity), bool)
        active = []
        for b, row in enumerate(rows):
            if row is not None and row.stop is None and row.length + 1 > self.max_context:
                row.stop = "capacity"
            if row is not None and row.stop is None:
                ids[b, 0], slots[b, 0] = row.root, row.length
                allowed[b, 0, :row.length + 1] = True
                active.append(b)
            else:
                slots[b], allowed[b] = self._idle(1)
        if not active:
            return
        picked = self._call(ids, slots, allowed, np.array(active), np.zeros(len(active), np.int64))
        self.stats.decode_calls += 1
        for b, logits in zip(active, picked):
            rows[b].length += 1
            self._emit(rows[b], self._choose(logits, rows[b]))

    # ------------------------------------------------------------------ token choice
    @staticmethod
    def _choose(logits: np.ndarray, row: _Row) -> int:
        """The token at position ``row.length`` (the row's logits were computed at slot length - 1)."""
        if row.sampling.greedy:
            return int(np.argmax(logits))
        return int(sample_rows(logits[None], [row.length], row.sampling)[0])

    def _emit(self, row: _Row, token: int) -> None:
        """Append ``token``; stop on a stop id (kept) or at max_new_tokens, like ``generate._emit``."""
        row.tokens.append(token)
        if token in self.stop_ids:
            row.stop = "eos"
        elif len(row.tokens) >= self.max_new_tokens:
            row.stop = "max_new_tokens"
        else:
            row.root = token
