"""In-graph position-keyed sampler: logits [B, N, V] and positions [B, N] -> tokens [B, N] int32.

The same rule as the host reference eagle_ms/sampling.py (whose docstring states it: temperature, then
top-k, then top-p with "keep every token equal to the boundary one" ties, then Gumbel-max with noise
keyed by (seed, absolute position)), written with MindSpore ops only, so a verify graph can sample
without shipping [N, V] logits to the host. tests/test_sampling.py checks the hash words bit for bit
and the tokens against the reference.

uint32 arithmetic is done in int32 words: add and multiply wrap mod 2**32 in two's complement (the
same bits as uint32), and a logical right shift is an arithmetic shift masked to the low 32 - s bits.
Sampling parameters are compile-time constants of the Cell (one graph per parameter set; none per call).
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops

from eagle_ms.config import SamplingParams

# The constants of eagle_ms/sampling.py (MIX_MUL, MIX_SHIFT, WEYL, U_BITS), as int32 words.
_MIX_MUL = (0x7FEB352D, 0x846CA68B - 2 ** 32)
_MIX_SHIFT = (16, 15, 16)
_WEYL = 0x9E3779B9 - 2 ** 32
_U_BITS = 23


def _shift_right(x, s: int):
    """Logical right shift of int32 words x [...] by s in [1, 31]."""
    return ops.bitwise_and(ops.bitwise_right_shift(x, s), (1 << (32 - s)) - 1)


def mix32(x):
    """lowbias32 on int32 words [...] (eagle_ms/sampling.py ``mix32``, same bits)."""
    x = ops.bitwise_xor(x, _shift_right(x, _MIX_SHIFT[0]))
    x = x * _MIX_MUL[0]
    x = ops.bitwise_xor(x, _shift_right(x, _MIX_SHIFT[1]))
    x = x * _MIX_MUL[1]
    return ops.bitwise_xor(x, _shift_right(x, _MIX_SHIFT[2]))


def noise_words(seed, positions, steps):
    """word(seed, p, v) = mix(mix(mix(seed) ^ p) + v * WEYL): seed [1] int32, positions [B, N] int32,
    steps [V] int32 (= v * WEYL, wrapped) -> int32 words [B, N, V]."""
    keys = mix32(ops.bitwise_xor(mix32(seed), positions))  # [B, N]
    return mix32(keys.expand_dims(-1) + steps)             # [B, N, V]


def gumbel_noise(words):
    """-log(-log(u)), u = ((word >>> 9) + 0.5) * 2**-23: int32 [..., V] -> float32 [..., V]."""
    u = (_shift_right(words, 32 - _U_BITS).astype(ms.float32) + 0.5) * (2.0 ** -_U_BITS)
    return -ops.log(-ops.log(u))


class Sampler(nn.Cell):
    """``construct(logits [B, N, V] f32, positions [B, N] i32) -> [B, N] int32``: row (b, n) draws the
    token at absolute position positions[b, n]. Temperature 0: argmax (first max)."""

    def __init__(self, params: SamplingParams, vocab_size: int):
        super().__init__()
        self.greedy = params.greedy
        self.temperature = float(params.temperature) if not params.greedy else 1.0
        self.top_k = params.top_k if 0 < params.top_k < vocab_size else 0
        self.top_p = float(params.top_p)
        self.vocab_size = vocab_size
        self.seed = Tensor(np.array([params.seed], np.int64).astype(np.uint32).view(np.int32))  # [1] word
        steps = (np.arange(vocab_size, dtype=np.int64) * _WEYL) % 2 ** 32  # v * WEYL mod 2**32, exact in int64
        self.steps = Tensor(steps.astype(np.uint32).view(np.int32))  # [V] int32 words
        self.argmax = ops.Argmax(axis=-1, output_type=ms.int32)

    def kept(self, z):
        """Top-k then top-p kept set of z [B, N, V] float32 -> bool [B, N, V] (ties at a boundary kept)."""
        keep = ops.ones_like(z).astype(ms.bool_)
        if self.top_k:
            kth = ops.topk(z, self.top_k)[0][..., self.top_k - 1:self.top_k]  # [B, N, 1] k-th largest
            keep = z >= kth
        if self.top_p < 1.0:
            e = ops.where(keep, ops.exp(z - z.max(axis=-1, keepdims=True)), ops.zeros_like(z))
            ordered = ops.sort(e, axis=-1, descending=True)[0]
            running = ops.cumsum(ordered, axis=-1)
            bound = running[..., -1:] * self.top_p
            j = (running < bound).astype(ms.int32).sum(axis=-1, keepdims=True)  # [B, N, 1]
            j = ops.minimum(j, self.vocab_size - 1)
            keep = ops.logical_and(keep, e >= ops.gather_elements(ordered, -1, j))
        return keep

    def construct(self, logits, positions):
        if self.greedy:
            return self.argmax(logits)
        z = logits / self.temperature
        keep = self.kept(z)
        noise = gumbel_noise(noise_words(self.seed, positions, self.steps))
        scores = ops.where(keep, z + noise, ops.full_like(z, float("-inf")))
        return self.argmax(scores)
