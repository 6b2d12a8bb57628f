"""Position-keyed sampling: the host NumPy reference of the token choice (one place for the rule).

The in-graph version (eagle_ms/models/sampler.py) implements the same rule with MindSpore int32 and
float32 ops; tests/test_sampling.py checks the two against each other (hash bit for bit, tokens equal).

**Processing of one row** (logits l [V] float32 of the teacher at the node whose NEXT token is drawn):

1. temperature: z = l / T (float32). T = 0 is greedy: the token is argmax(l), first index on ties, and
   top-k / top-p are not applied (the argmax is always kept by both).
2. top-k (k > 0 and k < V): keep every token with z >= the k-th largest z. Tie rule: every token equal
   to the k-th value is kept, so more than k tokens survive a tie at the boundary.
3. top-p (p < 1): e = exp(z - max z) on the kept tokens (0 elsewhere), sorted descending; c = the
   float32 running sum of the sorted e; j = #{i : c_i < p * c_last} (the index of the first sorted
   token whose running sum reaches mass p), b = sorted e_j; keep every kept token with e >= b. Tie
   rule: every token whose e equals the boundary one is kept. In exact arithmetic this keeps token v iff
   the mass of the tokens strictly more likely than v is < p: ties are kept or dropped together, and
   the order among equal values does not matter (equal values give the same running sums).

**Randomness keyed by absolute position.** For uint32 words (all arithmetic mod 2**32), ``mix`` is
the lowbias32 integer finaliser: x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B;
x ^= x >> 16 (a bijection of uint32). Token v of the row at absolute position p gets

    key(seed, p)     = mix(mix(seed) ^ p)
    word(seed, p, v) = mix(key(seed, p) + v * 0x9E3779B9)        (a Weyl sequence per position)
    u = ((word >> 9) + 0.5) * 2**-23    in (0, 1), exact in float32 (23 random bits)
    g = -log(-log(u))                   a Gumbel(0, 1) draw (float32)

and the token is argmax over the kept set of z_v + g_v (first index on ties; dropped tokens score
-inf). So the token emitted at position p depends only on (seed, p, the teacher's logits for p).

**Why this is a sample of the processed distribution** (Gumbel-max). Let K be the kept set and
q_v = exp(z_v) / sum_{w in K} exp(z_w), the processed distribution. With g_v iid Gumbel(0, 1)
(CDF F(x) = exp(-exp(-x))), s_v = z_v + g_v has CDF exp(-exp(z_v - x)), so

    P(argmax s = w) = int f_w(x) prod_{v != w} F_v(x) dx
                    = int exp(z_w - x) exp(-exp(-x) sum_{v in K} exp(z_v)) dx = exp(z_w) / sum_v exp(z_v) = q_w

(substitute t = exp(-x)). The words stand in for iid uniforms: distinct (p, v) give distinct Weyl
states for one position, and mix decorrelates neighbouring states; the 23-bit u makes g a discretised
Gumbel whose CDF is off by at most 2**-23. Draws at different positions are (pseudo-)independent, so
a sequence decoded this way is a sample of the teacher's processed sequence distribution.

Example (V = 4, T = 1, top-k 2, top-p 1): l = [1, 3, 3, 2] -> the 2nd largest z is 3, K = {1, 2};
the token is 1 or 2, whichever of 3 + g_1, 3 + g_2 is larger (q = [0, 0.5, 0.5, 0]).
"""
from __future__ import annotations

import numpy as np

from eagle_ms.config import SamplingParams

__all__ = ["MIX_MUL", "WEYL", "mix32", "position_keys", "noise_words", "uniforms", "gumbel", "kept_mask",
           "sample_rows", "stream_seed"]

MIX_MUL = (0x7FEB352D, 0x846CA68B)  # lowbias32 multipliers
MIX_SHIFT = (16, 15, 16)
WEYL = 0x9E3779B9  # 2**32 / golden ratio, odd
U_BITS = 23


def mix32(x) -> np.ndarray:
    """lowbias32 of uint32 words (wrapping arithmetic). Example: mix32(1) = 0x688990C0 (tested)."""
    x = np.array(x, dtype=np.uint32)  # a copy
    x ^= x >> np.uint32(MIX_SHIFT[0])
    x *= np.uint32(MIX_MUL[0])
    x ^= x >> np.uint32(MIX_SHIFT[1])
    x *= np.uint32(MIX_MUL[1])
    x ^= x >> np.uint32(MIX_SHIFT[2])
    return x


def position_keys(seed, positions) -> np.ndarray:
    """key(seed, p) = mix(mix(seed) ^ p): seed (an int, or ints broadcast with positions) and positions
    [...] (ints >= 0) -> uint32 [...]."""
    return mix32(mix32(np.asarray(seed, dtype=np.uint32)) ^ np.asarray(positions, dtype=np.uint32))


def noise_words(seed, positions, vocab_size: int) -> np.ndarray:
    """word(seed, p, v) for positions [...] (seed an int or broadcast with them) -> uint32 [..., V]."""
    steps = np.arange(vocab_size, dtype=np.uint32) * np.uint32(WEYL)  # [V], wraps mod 2**32
    return mix32(position_keys(seed, positions)[..., None] + steps)


def uniforms(words: np.ndarray) -> np.ndarray:
    """((word >> 9) + 0.5) * 2**-23 as float32, in (0, 1); exact (24 significant bits)."""
    return ((words >> np.uint32(32 - U_BITS)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -U_BITS)


def gumbel(seed, positions, vocab_size: int) -> np.ndarray:
    """Gumbel(0, 1) noise [..., V] float32 of the rows at ``positions`` [...] (seeds as noise_words)."""
    u = uniforms(noise_words(seed, positions, vocab_size))
    return -np.log(-np.log(u))


def kept_mask(z: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Tokens kept by top-k then top-p (tie rules in the module docstring): z [R, V] float32 -> bool [R, V].

    Example: z = [[0, 0, 0, 1]], top_k 0, top_p 0.5: e = [e^-1 x3, 1] sorted [1, e^-1, e^-1, e^-1],
    running sums [1, 1.37, 1.74, 2.10]; p * total = 1.05, j = 1, b = e^-1: all four kept (a tie at b).
    """
    vocab = z.shape[-1]
    keep = np.ones(z.shape, dtype=bool)
    if 0 < top_k < vocab:
        kth = np.partition(z, vocab - top_k, axis=-1)[..., vocab - top_k:vocab - top_k + 1]  # [R, 1]
        keep = z >= kth
    if top_p < 1.0:
        e = np.where(keep, np.exp(z - z.max(axis=-1, keepdims=True)), np.float32(0))  # [R, V] float32
        ordered = np.sort(e, axis=-1)[:, ::-1]                                      # descending
        running = np.cumsum(ordered, axis=-1, dtype=np.float32)                     # sequential float32
        bound = np.float32(top_p) * running[..., -1:]
        j = np.minimum((running < bound).sum(axis=-1, keepdims=True), vocab - 1)     # [R, 1]
        keep &= e >= ordered[np.arange(ordered.shape[0])[:, None], j]
    return keep


def sample_rows(logits: np.ndarray, positions, params: SamplingParams, seeds=None) -> np.ndarray:
    """The token drawn for each row: logits [R, V] (row r predicts the token at positions[r]) -> int32 [R].

    Greedy (temperature 0): argmax, first index on ties. Otherwise argmax over the kept set of
    z + Gumbel noise keyed by (seed, position); rows with equal (seed, position) share their noise.
    ``seeds`` [R]: row r's seed (independent runs decoded side by side); default params.seed for all.
    """
    logits = np.asarray(logits, dtype=np.float32)
    positions = np.asarray(positions, dtype=np.int64).reshape(-1)
    seeds = np.full(positions.shape, params.seed, np.int64) if seeds is None else np.asarray(seeds, np.int64)
    if logits.ndim != 2 or positions.shape != logits.shape[:1] or seeds.shape != positions.shape:
        raise ValueError(f"sample_rows: logits [R, V], positions [R] and seeds [R] expected, got shapes "
                         f"{logits.shape}, {positions.shape} and {seeds.shape}")
    if params.greedy:
        return logits.argmax(axis=-1).astype(np.int32)
    if positions.size and (positions.min() < 0 or positions.max() >= 2 ** 31 or seeds.min() < 0
                           or seeds.max() >= 2 ** 32):
        raise ValueError(f"sample_rows: positions must be in [0, 2**31) and seeds in [0, 2**32), got positions "
                         f"{positions.min()}..{positions.max()}, seeds {seeds.min()}..{seeds.max()}")
    z = logits / np.float32(params.temperature)
    keep = kept_mask(z, params.top_k, params.top_p)
    if positions.size == 1:  # the common decode step: no pairs to share
        noise = gumbel(seeds, positions, logits.shape[-1])
    else:
        unique, inverse = np.unique((seeds << 31) | positions, return_inverse=True)  # one draw per (seed, p)
        noise = gumbel(unique >> 31, unique & (2 ** 31 - 1), logits.shape[-1])[inverse]  # [R, V]
    scores = np.where(keep, z + noise, np.float32(-np.inf))
    return scores.argmax(axis=-1).astype(np.int32)


def stream_seed(seed: int, salt: int) -> int:
    """A seed for one of many independent streams (e.g. one per regenerated conversation):
    mix(mix(seed) ^ mix(salt)), an int in [0, 2**32). Positions then key the draws within the stream."""
    return int(mix32(mix32(np.uint32(seed)) ^ mix32(np.uint32(salt % 2 ** 32))))
