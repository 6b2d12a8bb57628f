"""Self-attention over the static KV cache, shared by the teacher and the EAGLE-3 draft.

Attribute names match HF checkpoints (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``). The teacher's
q/k/v read the hidden state (``in_features`` = H, bias per config); the draft's read the 2H concat of
its normed embedding and feature (no bias).
"""
from __future__ import annotations

from mindspore import nn

from eagle_ms.models.attention import make_attention
from eagle_ms.models.kv_cache import KVCache
from eagle_ms.models.layers import Linear, apply_rope


class CachedAttention(nn.Cell):
    def __init__(self, in_features: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 bias: bool, batch: int, capacity: int, backend: str, dtype):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = Linear(in_features, num_heads * head_dim, bias, dtype)
        self.k_proj = Linear(in_features, num_kv_heads * head_dim, bias, dtype)
        self.v_proj = Linear(in_features, num_kv_heads * head_dim, bias, dtype)
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
        b, n, _ = x.shape
        d = self.head_dim
        cos, sin = cos.reshape(cos.shape[0], cos.shape[2], 1, d), sin.reshape(sin.shape[0], sin.shape[2], 1, d)
        q = apply_rope(self.q_proj(x).reshape(b, n, self.num_heads, d), cos, sin).swapaxes(1, 2)  # [B,Hq,N,D]
        k = apply_rope(self.k_proj(x).reshape(b, n, self.num_kv_heads, d), cos, sin)   # [B, N, Hkv, D]
        v = self.v_proj(x).reshape(b, n, self.num_kv_heads, d)
        if rows is None:
            return self.o_proj(self.attn(q, k.swapaxes(1, 2), v.swapaxes(1, 2), mask))
        k_win, v_win = self.kv_cache.update(k, v, rows, mask.shape[-1])  # written as [B, N, Hkv, D]; read [B, Hkv, W, D]
        return self.o_proj(self.attn(q, k_win, v_win, mask))
