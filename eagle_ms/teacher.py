"""Host-side driver of the teacher Cell: fixed-shape calls for prefill, decode and tree verify.

Every call hands the Cell fixed shapes only: prefill in chunks of ``prefill_chunk`` tokens (the last
chunk padded), decode/verify with ``N = budget + 1`` query tokens. So a run compiles one graph per
distinct N (prefill chunk, 1, and each tree budget) and never per prompt length.

Index spaces (never mixed): RoPE ``position_ids``, cache ``cache_slots``, mask rows. For a chain they
coincide up to an offset; for a tree, position = L + depth while slot = L + node id.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mindspore import Tensor

from eagle_ms.cache import BranchCache
from eagle_ms.token_ids import check_token_ids
from eagle_ms.tree import TreeTensors, verify_attention_mask


def causal_chunk_mask(committed_len: int, n: int, capacity: int) -> np.ndarray:
    """allowed [n, capacity] bool for n consecutive tokens at slots [L, L+n): row i sees [0, L+i].

    Example: L=2, n=2, capacity=5 -> [[1,1,1,0,0], [1,1,1,1,0]].
    """
    cols = np.arange(capacity)[None, :]
    return cols <= committed_len + np.arange(n)[:, None]


@dataclass(frozen=True)
class TeacherOutput:
    """Teacher results for the valid query rows: logits [n, V] fp32, aux [n, 3H], argmax [n]."""

    logits: np.ndarray
    aux: np.ndarray
    argmax: np.ndarray


class TeacherRunner:
    """Owns the teacher Cell's committed length and issues its fixed-shape calls (batch 1)."""

    def __init__(self, model, prefill_chunk: int, commit_width: int, attention_windows=None):
        self.model = model
        self.capacity = model.capacity
        self.vocab_size = model.config.vocab_size
        self.prefill_chunk = prefill_chunk
        self._checked_prompt: np.ndarray | None = None  # the last array check_prompt returned
        self.cache = BranchCache(self.capacity, model.make_mover(), commit_width)
        windows = sorted(set(attention_windows or ())) + [self.capacity]
        self.attention_windows = tuple(w for w in windows if w <= self.capacity)  # ascending, ends at capacity

    def attention_width(self, end: int) -> int:
        """Mask width of a call whose last written slot is ``end - 1``: the smallest attention window
        >= end. Attention reads only cache slots [0, width); each window is one more graph per N.

        Example: windows (256, 512, 2048), L=300, N=17 -> end 317 -> width 512.
        """
        for w in self.attention_windows:
            if w >= end:
                return w
        raise ValueError(f"KV cache full: {end} slots needed, capacity {self.capacity}")

    @property
    def length(self) -> int:
        return self.cache.length

    def reset(self) -> None:
        self.cache.reset()

    def rewind(self, length: int) -> None:
        """Treat only slots [0, length) as committed (length <= the committed length). The K/V beyond
        stay in the cache and are overwritten by the next call (reference re-decodes, restores)."""
        if not 0 <= length <= self.capacity:
            raise ValueError(f"rewind to {length}: must be in [0, capacity {self.capacity}]")
        self.cache.length = length

    def _call(self, ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, allowed: np.ndarray):
        logits, aux = self.model(Tensor(ids[None].astype(np.int32)), Tensor(positions[None].astype(np.int32)),
                                 Tensor(slots[None].astype(np.int32)), Tensor(allowed[None]))
        return logits.asnumpy()[0], aux.asnumpy()[0]

    def check_prompt(self, prompt_ids) -> np.ndarray:
        """The prompt as a read-only int32 array [P] if every id is in the vocabulary and it fits the cache,
        else ValueError. ``prefill`` of the very array returned last is not checked again (it is read-only,
        so it still holds what was checked): ``Session.generate`` checks before compiling, then prefills."""
        prompt_ids = check_token_ids(prompt_ids, self.vocab_size)
        self.check_prompt_fits(prompt_ids.size)
        prompt_ids.flags.writeable = False
        self._checked_prompt = prompt_ids
        return prompt_ids

    def check_prompt_fits(self, n_prompt: int) -> None:
        """Raise ValueError if a prompt of n_prompt tokens cannot be prefilled and decoded once."""
        chunk = self.prefill_chunk
        padded = -(-n_prompt // chunk) * chunk
        if n_prompt < 1:
            raise ValueError("prompt is empty: at least one token is needed")
        if padded > self.capacity or n_prompt + 1 > self.capacity:
            raise ValueError(f"prompt of {n_prompt} tokens does not fit the KV cache: it needs "
                             f"{max(padded, n_prompt + 1)} slots (prefill_chunk {chunk}) but "
                             f"runtime.seq_length is {self.capacity}")

    def prefill(self, prompt_ids: np.ndarray) -> TeacherOutput:
        """Run the prompt through the cache in fixed chunks; commit it. Returns per-token outputs [P, ...].

        Raises ValueError for an id outside the vocabulary (naming its position) or a prompt that does not
        fit the cache, before any call (unless ``prompt_ids`` is what ``check_prompt`` just returned)."""
        if prompt_ids is not self._checked_prompt:
            prompt_ids = self.check_prompt(prompt_ids)
        self.reset()
        chunk = self.prefill_chunk
        logits, aux = [], []
        for start in range(0, prompt_ids.size, chunk):
            real = prompt_ids[start:start + chunk]
            ids = np.zeros(chunk, np.int32)
            ids[: real.size] = real
            slots = self.cache.branch_slots(chunk)
            width = self.attention_width(self.length + chunk)
            lg, ax = self._call(ids, slots, slots, causal_chunk_mask(self.length, chunk, width))
            logits.append(lg[: real.size])
            aux.append(ax[: real.size])
            self.cache.commit_by_length(real.size - 1)
        logits = np.concatenate(logits)
        return TeacherOutput(logits, np.concatenate(aux), logits.argmax(-1))

    def verify(self, tensors: TreeTensors, allowed: np.ndarray | None = None) -> TeacherOutput:
        """One tree-masked forward over all N nodes at slots [L, L+N); the committed prefix is untouched.

        ``allowed`` [N, W]: the verify mask if already built (W = ``self.attention_width(L + N)``).
        """
        assert tensors.committed_len == self.length, "tree tensorised for another committed length"
        check_token_ids(tensors.tokens, self.vocab_size, "draft tree")
        if allowed is None:
            allowed = verify_attention_mask(tensors, self.attention_width(self.length + tensors.num_nodes))
        logits, aux = self._call(tensors.tokens, tensors.position_ids, tensors.cache_slots, allowed)
        return TeacherOutput(logits, aux, logits.argmax(-1))

    def decode_chain(self, tokens: np.ndarray) -> TeacherOutput:
        """Sequential one-token decode of ``tokens`` (reference checks); commits each token."""
        outs = []
        for tok in np.asarray(tokens, dtype=np.int32):
            slot = self.cache.branch_slots(1)
            width = self.attention_width(self.length + 1)
            outs.append(self._call(np.array([tok]), slot, slot, causal_chunk_mask(self.length, 1, width)))
            self.cache.commit_by_length(0)
        logits = np.concatenate([o[0] for o in outs])
        return TeacherOutput(logits, np.concatenate([o[1] for o in outs]), logits.argmax(-1))

    def warm_up(self, query_sizes) -> None:
        """Compile every graph a generation can use: the prefill chunk and each N in ``query_sizes``,
        for every attention window (a call ending exactly at the window uses it), and the cache mover.
        Writes dummy K/V beyond the committed region only; leaves the cache empty (length 0).
        """
        for w in self.attention_windows:
            for n in sorted(set(query_sizes) | {self.prefill_chunk}):
                if n > w:
                    continue  # n tokens can never end inside this window
                slots = np.arange(w - n, w, dtype=np.int32)
                self._call(np.zeros(n, np.int32), slots, slots, causal_chunk_mask(w - n, n, w))
        if self.cache.mover is not None and self.capacity >= self.cache.width:
            ident = np.arange(self.cache.width, dtype=np.int32)[None]
            self.cache.mover(Tensor(ident), Tensor(ident))
        self.reset()

    def cache_rows(self, start: int, stop: int) -> list[np.ndarray]:
        """Host copies of K and V for slots [start, stop) of every layer: list of [Hkv, stop-start, D]."""
        rows = []
        for cache in self.model.caches():
            for param in (cache.k_cache, cache.v_cache):
                full = param.asnumpy().reshape(cache.batch, cache.num_kv_heads, cache.capacity, cache.head_dim)
                rows.append(full[0, :, start:stop].copy())
        return rows

    def snapshot(self) -> list[np.ndarray]:
        return [p.asnumpy().copy() for c in self.model.caches() for p in (c.k_cache, c.v_cache)]

    def restore(self, snapshot: list[np.ndarray], length: int) -> None:
        params = [p for c in self.model.caches() for p in (c.k_cache, c.v_cache)]
        for param, value in zip(params, snapshot):
            param.set_data(Tensor(value))
        self.rewind(length)
