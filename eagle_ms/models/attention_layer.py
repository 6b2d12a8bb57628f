"""Self-attention over the static KV cache, shared by the teacher and the EAGLE-3 draft.

q, k and v are one packed projection ``qkv_proj`` (``FusedLinear`` with the HF parts ``q_proj``,
``k_proj``, ``v_proj``; checkpoints keep those keys, eagle_ms/models/param_layout.py); ``o_proj`` as in HF.
The teacher's q/k/v read the hidden state (``in_features`` = H, bias per config); the draft's read the 2H
concat of its normed embedding and feature (no bias).
"""
from __future__ import annotations

from mindspore import nn, ops

from eagle_ms.models.attention import make_attention
from eagle_ms.models.kv_cache import KVCache
from eagle_ms.models.layers import FusedLinear, Linear, apply_rope


class CachedAttention(nn.Cell):
    def __init__(self, in_features: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 bias: bool, batch: int, capacity: int, backend: str, dtype):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.qkv_proj = FusedLinear(in_features, (("q_proj", num_heads * head_dim), ("k_proj", num_kv_heads * head_dim),
                                                  ("v_proj", num_kv_heads * head_dim)), bias, dtype)
        self.o_proj = Linear(num_heads * head_dim, hidden, bias, dtype)
        self.kv_cache = KVCache(batch, num_kv_heads, capacity, head_dim, dtype)
        self.attn = make_attention(backend, num_heads, num_kv_heads, head_dim)

    def construct(self, x, cos, sin, rows, mask):
        """x [B,N,in]; cos/sin [B,1,N,D] (or [B,1,1,D]: one position for every row); mask prepared by the
        backend, width W. RoPE is applied in the projection layout [B, N, heads, D] (the tables as
        [B, N, 1, D], a free reshape), so K and V reach the cache without a transpose.

        rows [B*N*Hkv] (``kv_cache.flat_rows``, order (b, n, h)): cache rows to write, then attend over cache slots [0, W) (the mask's static width
        selects the window); or None: no cache, attend over the N tokens themselves (training, features).
        """
        q, k, v = self.project(x, cos, sin)
        q = q.swapaxes(1, 2)  # [B, Hq, N, D]
        if rows is None:
            return self.o_proj(self.attn(q, k.swapaxes(1, 2), v.swapaxes(1, 2), mask))
        k_win, v_win = self.kv_cache.update(k, v, rows, mask.shape[-1])  # written as [B, N, Hkv, D]; read [B, Hkv, W, D]
        return self.o_proj(self.attn(q, k_win, v_win, mask))

    def project(self, x, cos, sin):
        """x [B,N,in] -> q [B,N,Hq,D], k [B,N,Hkv,D] (both rotated), v [B,N,Hkv,D]; cos/sin as ``construct``.

        One matmul, one split of the heads into (q|k, v), RoPE on q|k at once, one split into q and k.
        """
        b, n, _ = x.shape
        d, hq, hkv = self.head_dim, self.num_heads, self.num_kv_heads
        cos, sin = cos.reshape(cos.shape[0], cos.shape[2], 1, d), sin.reshape(sin.shape[0], sin.shape[2], 1, d)
        qk, v = ops.split(self.qkv_proj(x).reshape(b, n, hq + 2 * hkv, d), (hq + hkv, hkv), 2)
        q, k = ops.split(apply_rope(qk, cos, sin), (hq, hkv), 2)
        return q, k, v
