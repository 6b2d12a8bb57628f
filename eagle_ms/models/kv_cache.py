"""Static KV cache Cells: fixed-shape Parameters written in place, and the commit-by-path mover graph.

Device layout (one layer, K and V alike): a Parameter of shape ``[B * Hkv * S, D]`` ("flat slot
layout"), i.e. the row-major flattening of ``[B, Hkv, S, D]``. Writing N new tokens is one in-place
``ScatterUpdate`` at flat rows

    row(b, h, slot) = (b * Hkv + h) * S + slot,   listed in the order (b, n, h)

so the new K and V go in as projected, [B, N, Hkv, D] flattened, with no transpose to the head-major
layout (one Transpose kernel per K and per V per layer saved when N > 1).
Worked example: B=1, Hkv=2, S=8, slots=[5, 6] -> rows [5, 13, 6, 14] (slot 5 of heads 0, 1, then slot 6).

Attention reads slots [0, W) of every head with one ``Gather`` of the rows ``window_rows`` (constant per
graph), or, with the fused CPU kernels, in place (``cpu_kernels.window_attention_op`` over ``write``'s outputs). It copies the W slots read; a reshape of the whole Parameter to [B, Hkv, S, D] is NOT free on
CPU (MindSpore copies a reshaped Parameter: all S slots, every layer, every call).

Which slots a call may write (the branch region) and when they count as committed is host bookkeeping:
eagle_ms/cache.py.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from eagle_ms.models.fixed_call import FixedSignatureCall


def flat_rows(slots, num_kv_heads: int, capacity: int):
    """slots [B, N] int32 (in-graph) -> flat cache rows [B * N * Hkv] int32, order (b, n, h): the order of
    K/V rows [B, N, Hkv, D] flattened (module doc)."""
    b, n = slots.shape
    heads = ops.arange(num_kv_heads, dtype=ms.int32).reshape(1, 1, num_kv_heads)
    batch = ops.arange(b, dtype=ms.int32).reshape(b, 1, 1)
    rows = (batch * num_kv_heads + heads) * capacity + slots.reshape(b, n, 1)
    return rows.reshape(-1)


def window_rows(batch: int, num_kv_heads: int, capacity: int, width: int):
    """Flat cache rows of slots [0, width) of every (b, h): [B * Hkv * width] int32, order (b, h, slot).

    Worked example: B=1, Hkv=2, S=8, width=3 -> [0, 1, 2, 8, 9, 10]. All inputs are static, so in a
    graph this is a compile-time constant.
    """
    heads = ops.arange(batch * num_kv_heads, dtype=ms.int32).reshape(-1, 1)
    return (heads * capacity + ops.arange(width, dtype=ms.int32).reshape(1, width)).reshape(-1)


class KVCache(nn.Cell):
    """One layer's K and V caches as Parameters of shape [B*Hkv*S, D] (see module doc)."""

    def __init__(self, batch: int, num_kv_heads: int, capacity: int, head_dim: int, dtype=ms.float32):
        super().__init__()
        self.batch = batch
        self.num_kv_heads = num_kv_heads
        self.capacity = capacity
        self.head_dim = head_dim
        shape = (batch * num_kv_heads * capacity, head_dim)
        self.k_cache = Parameter(Tensor(np.zeros(shape), dtype), name="k_cache", requires_grad=False)
        self.v_cache = Parameter(Tensor(np.zeros(shape), dtype), name="v_cache", requires_grad=False)
        self.scatter = ops.ScatterUpdate()

    def update(self, k, v, rows, width: int | None = None):
        """Write k, v [B, N, Hkv, D] at flat ``rows`` [B*N*Hkv] (``flat_rows``); return slots [0, W) of the updated
        caches as [B, Hkv, W, D] (W = ``width``, default S: the whole cache).

        The window is one gather of the rows ``window_rows(B, Hkv, S, W)`` from each scatter's output
        (the updated Parameter). Gathering from the Parameter itself is the same value, but in a graph
        that writes one cache several times (the draft tree step: once per depth) MindSpore then snapshots
        the whole Parameter with a TensorMove before each read. It copies only the W slots attention
        reads; reshaping the whole Parameter instead would copy all S slots.
        """
        d = self.head_dim
        k_all, v_all = self.write(k, v, rows)
        w = self.capacity if width is None else width
        window = window_rows(self.batch, self.num_kv_heads, self.capacity, w)  # constant, folded
        shape = (self.batch, self.num_kv_heads, w, d)
        return ops.gather(k_all, window, 0).reshape(shape), ops.gather(v_all, window, 0).reshape(shape)

    def write(self, k, v, rows):
        """Write k, v [B, N, Hkv, D] at flat ``rows`` [B*N*Hkv]; return the updated caches [B*Hkv*S, D] (the
        scatters' outputs: reading them orders every read after the write, without a copy)."""
        d = self.head_dim
        return (self.scatter(self.k_cache, rows, k.reshape(-1, d).astype(self.k_cache.dtype)),
                self.scatter(self.v_cache, rows, v.reshape(-1, d).astype(self.v_cache.dtype)))

    def move(self, src_rows, dst_rows):
        """Copy rows ``src_rows`` to ``dst_rows`` (both [K] int32) in K and V; gathers happen first.

        Returns one gathered element (a scalar) as the graph output: returning anything computed from
        the whole updated cache would copy it (measured: 20 ms vs 0.4 ms for 24 caches of 1 MB).
        The scatters are kept by MindSpore's side-effect ordering (auto-monad) although unused.
        """
        k_src = ops.gather(self.k_cache, src_rows, 0)
        v_src = ops.gather(self.v_cache, src_rows, 0)
        self.scatter(self.k_cache, dst_rows, k_src)
        self.scatter(self.v_cache, dst_rows, v_src)
        return k_src[0, 0]


class CacheMover(FixedSignatureCall, nn.Cell):
    """Graph that copies slots ``src [B, K] -> dst [B, K]`` in every layer's cache (commit by path).

    K is fixed (max_depth + 1) so it compiles once; unused entries copy a slot onto itself.
    """

    def __init__(self, caches: nn.CellList, num_kv_heads: int, capacity: int):
        super().__init__()
        self.caches = caches
        self.num_kv_heads = num_kv_heads
        self.capacity = capacity

    def construct(self, src_slots, dst_slots):
        src = flat_rows(src_slots, self.num_kv_heads, self.capacity)
        dst = flat_rows(dst_slots, self.num_kv_heads, self.capacity)
        total = ops.zeros((), ms.float32)
        for cache in self.caches:
            total = total + cache.move(src, dst).astype(ms.float32)
        return total
