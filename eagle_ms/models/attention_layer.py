"""Self-attention over the static KV cache, shared by the teacher and the EAGLE-3 draft.

q, k and v are one packed projection ``qkv_proj`` (``FusedLinear`` with the HF parts ``q_proj``,
``k_proj``, ``v_proj``; checkpoints keep those keys, eagle_ms/models/param_layout.py); ``o_proj`` as in HF.
The teacher's q/k/v read the hidden state (``in_features`` = H, bias per config); the draft's read the 2H
concat of its normed embedding and feature (no bias).
"""
from __future__ import annotations

import numpy as np

from mindspore import Tensor, nn, ops

from eagle_ms.models import cpu_kernels
from eagle_ms.models.attention import make_attention
from eagle_ms.models.kv_cache import KVCache
from eagle_ms.models.layers import FusedLinear, Linear, apply_rope, fused_kernel, half_swap_index


class CachedAttention(nn.Cell):
    def __init__(self, in_features: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 bias: bool, batch: int, capacity: int, backend: str, dtype, kernels: str = "composite"):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.qkv_proj = FusedLinear(in_features, (("q_proj", num_heads * head_dim), ("k_proj", num_kv_heads * head_dim),
                                                  ("v_proj", num_kv_heads * head_dim)), bias, dtype)
        self.o_proj = Linear(num_heads * head_dim, hidden, bias, dtype)
        self.kv_cache = KVCache(batch, num_kv_heads, capacity, head_dim, dtype)
        rotated = num_heads + num_kv_heads  # q and k heads; the v heads pass RoPE unchanged (cos 1, sin 0)
        keep = np.concatenate([np.ones(rotated), np.zeros(num_kv_heads)]).reshape(1, 1, -1, 1).astype(np.float32)
        self.rope_keep = Tensor(keep)        # [1, 1, Hq + 2Hkv, 1]
        self.rope_fill = Tensor(1.0 - keep)
        self.swap_index = Tensor(half_swap_index(head_dim))  # [D] int32, RoPE's half swap
        self.attn = make_attention(backend, num_heads, num_kv_heads, head_dim, kernels)
        self.window_in_place = kernels == "cpu" and backend == "eager"  # EagerAttention.over_cache
        # kernels 'cpu': bias, RoPE and the head split in one kernel (cpu_kernels.RopeSplit) over Rotary's tables
        self.rope_split = fused_kernel(kernels, lambda: cpu_kernels.rope_split_op(num_heads, num_kv_heads))
        heads = (num_heads + 2 * num_kv_heads) * head_dim
        self.qkv_bias = None if bias else Tensor(np.zeros(heads, np.float32))  # the kernel's bias when there is none

    def construct(self, x, cos, sin, rows, mask):
        """``attend``, then ``o_proj``: [B,N,in] -> [B,N,hidden]."""
        return self.o_proj(self.attend(x, cos, sin, rows, mask))

    def attend(self, x, cos, sin, rows, mask):
        """The attention before ``o_proj``: x [B,N,in] -> [B,N,Hq*D]. cos/sin: ``head_tables`` of the rows'
        positions, [B,N,Hq+2Hkv,D] (or [B,1,Hq+2Hkv,D]: one position for every row; [B,N,D] or [B,1,D] with
        the 'cpu' kernels); mask prepared by the backend, width W. K and V reach the cache in the projection layout [B, N, Hkv, D], without a transpose.

        rows [B*N*Hkv] (``kv_cache.flat_rows``, order (b, n, h)): cache rows to write, then attend over cache
        slots [0, W) (the mask's static width selects the window; the 'cpu' kernels read them in place, the
        composite form gathers them); or None: no cache, attend over the N tokens
        themselves (training, features).
        """
        if self.rope_split is not None:
            b, n, _ = x.shape
            qkv = self.qkv_proj.product(x).reshape(b, n, -1, self.head_dim)  # [B, N, Hq+2Hkv, D]
            if self.qkv_bias is None:
                q, k, v = self.rope_split(qkv, self.qkv_proj.bias, cos, sin)
            else:
                q, k, v = self.rope_split(qkv, self.qkv_bias, cos, sin)
        else:
            q, k, v = self.project(x, cos, sin)
            q = q.swapaxes(1, 2)  # [B, Hq, N, D]
        if rows is None:
            return self.attn(q, k.swapaxes(1, 2), v.swapaxes(1, 2), mask)
        if self.window_in_place:
            k_cache, v_cache = self.kv_cache.write(k, v, rows)
            return self.attn.over_cache(q, k_cache, v_cache, mask)
        k_win, v_win = self.kv_cache.update(k, v, rows, mask.shape[-1])  # written as [B, N, Hkv, D]; read [B, Hkv, W, D]
        return self.attn(q, k_win, v_win, mask)

    def head_tables(self, cos, sin):
        """``Rotary``'s (cos, sin) [B,1,N,D] -> per-head tables [B,N,Hq+2Hkv,D] for ``project``: the q and k
        heads get cos/sin, the v heads cos 1 and sin 0, so RoPE leaves v exactly as it is (v*1 + swap(v)*0).
        Three kernels; callers compute them once per forward (per depth table set) and share them across
        layers. Worked example (Hq 2, Hkv 1, one position): heads (q0, q1, k0) get (cos, sin), v0 (1, 0).

        With the 'cpu' kernels the tables are Rotary's own, as [B,N,D] (no kernel: the fused RoPE reads
        them per row and knows which heads to rotate).
        """
        b, _, n, d = cos.shape
        if self.rope_split is not None:
            return cos.reshape(b, n, d), sin.reshape(b, n, d)
        heads = self.rope_keep.shape[2]
        # sin: broadcast first. ``(sin * sign) * keep`` (Rotary's signed sin times a broadcasting constant)
        # came out of MindSpore 2.9's CPU graph with the shape [B, N, 1, D] at N = 1 (constant folding of
        # the two multiplies; tests/test_pangu_model.py's decode check caught it)
        return (cos.reshape(b, n, 1, d) * self.rope_keep + self.rope_fill,
                ops.broadcast_to(sin.reshape(b, n, 1, d), (b, n, heads, d)) * self.rope_keep)

    def project(self, x, cos, sin):
        """x [B,N,in] -> q [B,N,Hq,D], k [B,N,Hkv,D] (both rotated), v [B,N,Hkv,D]; cos/sin from ``head_tables``.

        One matmul, RoPE over all heads at once (identity on v), one equal split into chunks of Hkv heads
        (q chunks, k, v: one kernel), and a concat of the G = Hq/Hkv q chunks when G > 1.
        """
        b, n, _ = x.shape
        hq, hkv = self.num_heads, self.num_kv_heads
        qkv = apply_rope(self.qkv_proj(x).reshape(b, n, hq + 2 * hkv, self.head_dim), cos, sin, self.swap_index)
        chunks = ops.split(qkv, hkv, 2)  # Hq/Hkv + 2 chunks of [B, N, Hkv, D]
        groups = hq // hkv
        q = chunks[0] if groups == 1 else ops.concat(chunks[:groups], 2)
        return q, chunks[groups], chunks[groups + 1]
