"""Branch/commit bookkeeping of a static KV cache (host side): committed length, branch slots, commits.

The cache itself is a set of fixed-shape device Parameters (eagle_ms/models/kv_cache.py). Region contract
(per sequence, host side in ``BranchCache``):
  * slots ``[0, L)`` hold the committed prefix; a verify forward writes only slots ``[L, L+N)``
    (the branch region), so the committed prefix is never touched while a tree is verified;
  * ``commit_by_length(A)``: the accepted path is the chain of nodes 0..A, already at ``[L, L+A+1)``:
    only L advances;
  * ``commit_by_path(node_ids)``: gather the accepted nodes' K/V from ``L + node_ids`` and write them to
    ``[L, L+A+1)`` (one call of the model's ``CacheMover`` graph); when the path is already in order
    (node_ids == 0..A, the prefix-sharing fast path) nothing is copied; with ``moved=True`` a graph has
    already moved the rows itself (eagle_ms/models/verify_step.py with the fused CPU kernels) and only L
    advances.
"""
from __future__ import annotations

import numpy as np

from mindspore import Tensor


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

    def __init__(self, capacity: int, mover, width: int):
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

    def commit_by_path(self, node_ids: np.ndarray, moved: bool = False) -> bool:
        """Commit accepted nodes (root first). Returns True when a device copy was needed (made here with the
        CacheMover, or, with ``moved``, already made by the graph that verified them)."""
        node_ids = np.asarray(node_ids)
        if np.array_equal(node_ids, np.arange(node_ids.size)):  # prefix-sharing fast path: in order
            self.commit_by_length(node_ids.size - 1)
            return False
        if not moved:
            if self.mover is None:
                raise RuntimeError("commit_by_path needs a CacheMover for out-of-order paths")
            src, dst = path_move_slots(self.length, node_ids, self.width, self.capacity)
            self.mover(Tensor(src[None]), Tensor(dst[None]))
        self.length += node_ids.size
        self.copies += 1
        return True
