"""Static KV cache: fixed-shape Parameters written in place, plus branch/commit bookkeeping.

Device layout (one layer, K and V alike): a Parameter of shape ``[B * Hkv * S, D]`` ("flat slot
layout"), i.e. the row-major flattening of ``[B, Hkv, S, D]``. Reading it as ``[B, Hkv, S, D]`` is a free
reshape; writing N new tokens is one in-place ``ScatterUpdate`` at flat rows

    row(b, h, slot) = (b * Hkv + h) * S + slot

Worked example: B=1, Hkv=2, S=8, slots=[5, 6] -> rows [5, 6, 13, 14] (head 0 then head 1).

Region contract (per sequence, host side in ``BranchCache``):
  * slots ``[0, L)`` hold the committed prefix; a verify forward writes only slots ``[L, L+N)``
    (the branch region), so the committed prefix is never touched while a tree is verified;
  * ``commit_by_length(A)``: the accepted path is the chain of nodes 0..A, already at ``[L, L+A+1)``:
    only L advances;
  * ``commit_by_path(node_ids)``: gather the accepted nodes' K/V from ``L + node_ids`` and write them to
    ``[L, L+A+1)``; when the path is already in order (node_ids == 0..A, the prefix-sharing fast
    path) nothing is copied.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops


def flat_rows(slots, num_kv_heads: int, capacity: int):
    """slots [B, N] int32 (in-graph) -> flat cache rows [B * Hkv * N] int32, order (b, h, n)."""
    b, n = slots.shape
    heads = ops.arange(num_kv_heads, dtype=ms.int32).reshape(1, num_kv_heads, 1)
    batch = ops.arange(b, dtype=ms.int32).reshape(b, 1, 1)
    rows = (batch * num_kv_heads + heads) * capacity + slots.reshape(b, 1, n)
    return rows.reshape(-1)


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

    def update(self, k, v, rows):
        """Write k, v [B, Hkv, N, D] at flat ``rows`` [B*Hkv*N]; return the full caches [B, Hkv, S, D]."""
        d = self.head_dim
        k_done = self.scatter(self.k_cache, rows, k.reshape(-1, d).astype(self.k_cache.dtype))
        v_done = self.scatter(self.v_cache, rows, v.reshape(-1, d).astype(self.v_cache.dtype))
        k_all = ops.depend(self.k_cache, k_done)
        v_all = ops.depend(self.v_cache, v_done)
        shape = (self.batch, self.num_kv_heads, self.capacity, d)
        return k_all.reshape(shape), v_all.reshape(shape)

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


class CacheMover(nn.Cell):
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


def path_move_slots(committed_len: int, node_ids: np.ndarray, width: int,
                    capacity: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Source and destination slots [width] for committing ``node_ids`` (root first) at ``committed_len``.

    Entry i moves slot L + node_ids[i] to slot L + i; entries past the path copy slot
    (L + i) mod capacity onto itself (a no-op with distinct destinations, so the scatter never sees
    duplicate indices, and every slot stays inside the cache even when L + width > capacity).

    Example: L=10, node_ids=[0, 2, 5], width=4 -> src [10, 12, 15, 13], dst [10, 11, 12, 13].
    Near capacity: L=10, node_ids=[0, 2, 3], width=6, capacity=14
        -> src [10, 12, 13, 13, 0, 1], dst [10, 11, 12, 13, 0, 1].
    """
    node_ids = np.asarray(node_ids, dtype=np.int64)
    if node_ids.ndim != 1 or not 1 <= node_ids.size <= width:
        raise ValueError(f"node_ids must be 1-D with 1..{width} entries, got shape {node_ids.shape}")
    if node_ids[0] != 0 or np.any(np.diff(node_ids) <= 0):
        raise ValueError(f"node_ids must start at the root 0 and increase, got {node_ids.tolist()}")
    if capacity is not None and (width > capacity or committed_len + node_ids[-1] >= capacity):
        raise ValueError(f"cannot commit node_ids {node_ids.tolist()} at committed length {committed_len} "
                         f"with width {width} in a cache of capacity {capacity}")
    dst = committed_len + np.arange(width, dtype=np.int64)
    if capacity is not None:
        dst %= capacity
    src = dst.copy()
    src[: node_ids.size] = committed_len + node_ids
    return src.astype(np.int32), dst.astype(np.int32)


class BranchCache:
    """Host-side committed length of a static cache, and the two commit operations.

    ``mover`` is the model's CacheMover graph; ``width`` its fixed K (max tree depth + 1).
    """

    def __init__(self, capacity: int, mover: CacheMover | None, width: int):
        self.capacity = capacity
        self.mover = mover
        self.width = width
        self.length = 0  # L: committed slots [0, L)
        self.copies = 0  # commits that needed a device copy (full reorder), for traces

    def reset(self) -> None:
        self.length = 0
        self.copies = 0

    def branch_slots(self, n: int) -> np.ndarray:
        """Slots [n] of the branch region [L, L+n); raises if it does not fit the capacity."""
        if self.length + n > self.capacity:
            raise ValueError(f"KV cache full: committed {self.length} + {n} new slots > capacity {self.capacity}")
        return np.arange(self.length, self.length + n, dtype=np.int32)

    def commit_by_length(self, accepted: int) -> None:
        """The accepted chain is nodes 0..accepted, already in slots [L, L+accepted+1)."""
        self.length += accepted + 1

    def commit_by_path(self, node_ids: np.ndarray) -> bool:
        """Commit accepted nodes (root first). Returns True when a device copy was needed."""
        node_ids = np.asarray(node_ids)
        if np.array_equal(node_ids, np.arange(node_ids.size)):  # prefix-sharing fast path: in order
            self.commit_by_length(node_ids.size - 1)
            return False
        if self.mover is None:
            raise RuntimeError("commit_by_path needs a CacheMover for out-of-order paths")
        src, dst = path_move_slots(self.length, node_ids, self.width, self.capacity)
        self.mover(Tensor(src[None]), Tensor(dst[None]))
        self.length += node_ids.size
        self.copies += 1
        return True
