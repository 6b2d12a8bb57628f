"""Draft trees as fixed-shape, always-in-range NumPy tensors (NumPy only).

The structural invariants of these tensors, checked before a verify in reference mode, are in
eagle_ms/tree_checks.py.

A draft tree has a dummy root (node 0: the last chosen token, not yet in the teacher cache) and
draft nodes 1..M, each with a parent of smaller id. `tensorize` turns it into `TreeTensors` with
shapes fixed by the node budget M_b and the maximum depth D (N = M_b + 1), so one compiled verify
graph serves every step. Padding nodes M+1..M_b are `valid=False`, point at the root, have depth 0
and hold `pad_id`; no array ever holds a negative or out-of-range index.

Three index spaces, never mixed: node id / mask row (0..N-1), RoPE position (`position_ids`),
cache slot (`cache_slots`).

Worked example (L = committed_len = 5, budget 4, max_depth 2), draft parents [0, 0, 1]:

    node         0  1  2  3  4(pad)
    parent       0  0  0  1  0
    depth        0  1  1  2  0
    valid        T  T  T  T  F
    ancestors    0  1  2  3  4      A[0, k] = k
                 0  0  0  1  0      A[1, k] = parent[A[0, k]]
                 0  0  0  0  0      A[2, k] = parent[A[1, k]]
    position_ids 5  6  6  7  5      L + depth
    cache_slots  5  6  7  8  9      L + k (padding too: distinct slots, never committed)
    paths        [0 2 2] len 2      leaf 2; right-padded with the leaf id
                 [0 1 3] len 3      leaf 3
                 [0 0 0] len 0 ...  unused rows (P = max(M_b, 1) = 4 rows)
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Optional

import numpy as np

__all__ = ["DraftTree", "TreeTensors", "TreeInvariantError", "chain_first", "tensorize", "tree_mask",
           "verify_attention_mask"]

_INT32_MAX = np.iinfo(np.int32).max


class TreeInvariantError(ValueError):
    """A tree violates a structural invariant.

    `dump` is a JSON-ready dict (lists and ints): every array, committed_len, budget, max_depth,
    `check` (the failed check's name) and `detail`. `dump_path` is the JSON file written under
    `<run_dir>/failures/` when a run_dir was given (eagle_ms/trace.py ``write_failure_dump``), else None.
    """

    def __init__(self, message: str, dump: dict, dump_path: Optional[str] = None):
        super().__init__(message)
        self.dump = dump
        self.dump_path = dump_path


@dataclasses.dataclass(frozen=True, eq=False)
class DraftTree:
    """Draft nodes 1..M in id order; node k = i + 1 has token tokens[i] and parent parents[i].

    Only shapes/dtypes are validated here (so corrupted trees can be built for tests); structure
    (0 <= parents[i] < i + 1) is validated by `tensorize` before any gather.
    """

    root_token: int
    tokens: np.ndarray   # [M] int
    parents: np.ndarray  # [M] int, parents[i] in [0, i] (0 = root)
    scores: np.ndarray   # [M] float, cumulative draft log-prob (may be zeros)

    def __post_init__(self):
        object.__setattr__(self, "root_token", _as_int(self.root_token, "DraftTree.root_token"))
        tokens = _as_1d(self.tokens, "tokens", np.int64)
        for name, dtype in (("tokens", np.int64), ("parents", np.int64), ("scores", np.float64)):
            arr = _as_1d(getattr(self, name), name, dtype)
            if arr.shape != tokens.shape:
                raise ValueError(f"DraftTree.{name} has shape {arr.shape}, expected {tokens.shape} "
                                 "(same as tokens)")
            object.__setattr__(self, name, arr)

    @property
    def num_nodes(self) -> int:
        """M, the number of draft (non-root) nodes."""
        return int(self.tokens.shape[0])


@dataclasses.dataclass(frozen=True, eq=False)
class TreeTensors:
    """Fixed-shape tree tensors for budget M_b and max depth D; N = M_b + 1, P = max(M_b, 1).

    `cache_slots[k] = committed_len + k` for EVERY k, padding included: each node owns a distinct
    branch slot in [L, L + N). A padded node writes its K/V to its own slot, which no valid node
    attends to and which is never committed. This replaces a single shared "scratch slot", so a
    scatter over `cache_slots` never sees duplicate indices.
    """

    tokens: np.ndarray        # [N] int32, pad_id on padding
    parent: np.ndarray        # [N] int32, parent[0] = 0, padding 0
    depth: np.ndarray         # [N] int32, root 0, padding 0
    valid: np.ndarray         # [N] bool
    ancestors: np.ndarray     # [D+1, N] int32, A[0,k] = k, A[l+1,k] = parent[A[l,k]]
    position_ids: np.ndarray  # [N] int32, L + depth (padding: L)
    cache_slots: np.ndarray   # [N] int32, L + k
    tree_mask: np.ndarray     # [N, N] bool, True = row k may see column j
    paths: np.ndarray         # [P, D+1] int32, root-to-leaf ids padded with the leaf id
    path_lengths: np.ndarray  # [P] int32, nodes per path incl. root (unused rows 0)
    num_paths: int
    committed_len: int
    budget: int
    max_depth: int

    @property
    def num_nodes(self) -> int:
        """N = budget + 1 (root + draft nodes + padding)."""
        return self.budget + 1


def chain_first(tree: DraftTree) -> DraftTree:
    """The same tree renumbered in depth-first preorder, children by descending score (ties: lower id).

    The best-scoring chain from the root becomes nodes 1..d, so when the teacher accepts a prefix of it
    (the common case) the accepted node ids are 0..A, in slot order, and ``BranchCache.commit_by_path``
    takes its no-copy path. Parents still precede children. Invalid parents raise (``tensorize`` names
    the problem for trees that skip this step).
    Example: parents [0, 0, 1], scores [-1.0, -0.5, -1.2] -> order (2, 1, 3): tokens[1], tokens[0],
    tokens[2] with parents [0, 0, 2].
    """
    n = tree.num_nodes
    parents = tree.parents
    if n and (parents.min() < 0 or np.any(parents >= np.arange(1, n + 1))):
        raise ValueError("chain_first: parents must satisfy 0 <= parents[i] < i + 1")
    children: list[list[int]] = [[] for _ in range(n + 1)]
    for node in sorted(range(1, n + 1), key=lambda k: (-tree.scores[k - 1], k)):
        children[int(parents[node - 1])].append(node)
    order, stack = [], list(reversed(children[0]))
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(children[node]))
    new_id = np.zeros(n + 1, np.int64)
    new_id[order] = np.arange(1, n + 1)
    old = np.asarray(order, np.int64) - 1
    return DraftTree(tree.root_token, tree.tokens[old], new_id[parents[old]], tree.scores[old])


def _as_int(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _as_1d(value, name: str, dtype) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"DraftTree.{name} must be 1-D, got shape {arr.shape}")
    integer = np.issubdtype(dtype, np.integer)
    if arr.size and arr.dtype.kind not in ("iu" if integer else "iuf"):
        raise ValueError(f"DraftTree.{name} must hold {'integers' if integer else 'numbers'}, "
                         f"got dtype {arr.dtype}")
    return arr.astype(dtype)


def _check_limits(**limits) -> dict:
    out = {name: _as_int(value, name) for name, value in limits.items()}
    for name, value in out.items():
        if not 0 <= value < _INT32_MAX - out["budget"] - out["committed_len"]:
            raise ValueError(f"{name}={value} must be >= 0 (and committed_len + budget < 2**31)")
    return out


def _check_draft_structure(tree: DraftTree, limits: dict) -> None:
    """Raise TreeInvariantError unless 0 <= parents[i] < i + 1 for every draft node."""
    m = tree.num_nodes
    own_id = np.arange(1, m + 1)                                   # [M]
    bad = np.flatnonzero((tree.parents < 0) | (tree.parents >= own_id))
    if bad.size:
        k, p = int(own_id[bad[0]]), int(tree.parents[bad[0]])
        detail = f"DraftTree node {k} has parent {p}; need 0 <= parent < {k} (parent before child)"
        dump = {"check": "draft_parent_before_child", "detail": detail,
                "root_token": tree.root_token, "tokens": tree.tokens.tolist(),
                "parents": tree.parents.tolist(), "scores": tree.scores.tolist(), **limits}
        raise TreeInvariantError(detail, dump)
    bad_tok = np.flatnonzero((tree.tokens < 0) | (tree.tokens > _INT32_MAX))
    if bad_tok.size or not 0 <= tree.root_token <= _INT32_MAX:
        where = f"node {int(bad_tok[0]) + 1}" if bad_tok.size else "root_token"
        raise ValueError(f"DraftTree {where} token is outside [0, {_INT32_MAX}]")


def _ancestor_table(parent: np.ndarray, max_depth: int) -> np.ndarray:
    """[N] parent (all entries in [0, N)) -> [D+1, N] int32 table by repeated gather.

    Example: parent [0, 0, 1, 2], D = 2 -> [[0, 1, 2, 3], [0, 0, 1, 2], [0, 0, 0, 1]].
    """
    table = np.empty((max_depth + 1, parent.shape[0]), np.int32)   # [D+1, N]
    table[0] = np.arange(parent.shape[0])
    for level in range(max_depth):
        table[level + 1] = parent[table[level]]
    return table


def tree_mask(ancestors: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """[D+1, N] ancestors, [N] valid -> [N, N] bool; padded rows see only themselves.

    Example: ancestors [[0, 1, 2], [0, 0, 1]], valid all -> rows {0}, {0, 1}, {0, 1, 2}.
    """
    n = valid.shape[0]
    seen = np.zeros((n, n), bool)
    rows = np.broadcast_to(np.arange(n), ancestors.shape)          # [D+1, N], rows[l, k] = k
    seen[rows, ancestors] = True                                   # seen[k, A[l, k]]
    mask = seen & valid[:, None] & valid[None, :]
    mask[np.arange(n), np.arange(n)] = True
    return mask


def _leaf_paths(parent, valid, depth, ancestors, num_rows) -> tuple:
    """Root-to-leaf rows from the ancestor table, one per leaf in ascending leaf id.

    Row for leaf q of depth d: paths[r, i] = A[max(d - i, 0), q], so i <= d walks root -> q and
    i > d repeats A[0, q] = q. Example: A[:, 3] = [3, 1, 0], d = 2 -> [0, 1, 3]; with D = 3 the
    row is [0, 1, 3, 3]. Returns (paths [P, D+1] int32, path_lengths [P] int32, num_paths).
    """
    has_child = np.zeros(valid.shape[0], bool)
    has_child[parent[1:][valid[1:]]] = True
    leaves = np.flatnonzero(valid & ~has_child)                    # [num_paths] ascending
    levels = np.arange(ancestors.shape[0])                         # [D+1]
    steps = np.maximum(depth[leaves][:, None] - levels[None, :], 0)  # [num_paths, D+1]
    paths = np.zeros((num_rows, ancestors.shape[0]), np.int32)
    paths[:leaves.size] = ancestors[steps, leaves[:, None]]
    lengths = np.zeros(num_rows, np.int32)
    lengths[:leaves.size] = depth[leaves] + 1
    return paths, lengths, int(leaves.size)


def tensorize(tree: DraftTree, committed_len: int, budget: int, max_depth: int,
              pad_id: int = 0) -> TreeTensors:
    """DraftTree -> TreeTensors of fixed shapes (N = budget + 1, D = max_depth).

    Raises ValueError (naming the value) for bad limits, more than `budget` nodes, a node deeper
    than `max_depth` or a negative token; TreeInvariantError (a ValueError) for a parent that is
    negative or not smaller than its child, checked before any gather.
    """
    limits = _check_limits(committed_len=committed_len, budget=budget, max_depth=max_depth,
                           pad_id=pad_id)
    L, m_b, d_max = limits["committed_len"], limits["budget"], limits["max_depth"]
    m = tree.num_nodes
    if m > m_b:
        raise ValueError(f"tree has M={m} draft nodes, more than budget={m_b}")
    _check_draft_structure(tree, limits)
    n = m_b + 1
    parent = np.zeros(n, np.int32)                                 # [N]
    parent[1:m + 1] = tree.parents
    valid = np.zeros(n, bool)
    valid[:m + 1] = True
    ancestors = _ancestor_table(parent, d_max)                     # [D+1, N]
    too_deep = np.flatnonzero(valid & (ancestors[d_max] != 0))
    if too_deep.size:
        raise ValueError(f"node {int(too_deep[0])} is deeper than max_depth={d_max}")
    depth = np.where(valid, (ancestors != 0).sum(axis=0), 0).astype(np.int32)  # [N]
    tokens = np.full(n, limits["pad_id"], np.int32)
    tokens[0] = tree.root_token
    tokens[1:m + 1] = tree.tokens
    paths, lengths, num_paths = _leaf_paths(parent, valid, depth, ancestors, max(m_b, 1))
    return TreeTensors(
        tokens=tokens, parent=parent, depth=depth, valid=valid, ancestors=ancestors,
        position_ids=(L + depth).astype(np.int32),
        cache_slots=(L + np.arange(n)).astype(np.int32),
        tree_mask=tree_mask(ancestors, valid), paths=paths, path_lengths=lengths,
        num_paths=num_paths, committed_len=L, budget=m_b, max_depth=d_max)


def verify_attention_mask(t: TreeTensors, capacity: int) -> np.ndarray:
    """[N, capacity] bool, True = may attend; the single mask source for the verify forward.

    Row k sees committed columns [0, L) and branch columns L + j where tree_mask[k, j].
    Example: L = 2, chain of 2 nodes (N = 2), capacity 5 ->
        row 0: [T T T F F]     row 1: [T T T T F]
    """
    capacity = _as_int(capacity, "capacity")
    n, L = t.num_nodes, t.committed_len
    if L + n > capacity:
        raise ValueError(f"capacity={capacity} < committed_len={L} + N={n}")
    allowed = np.zeros((n, capacity), bool)                        # [N, capacity]
    allowed[:, :L] = True
    allowed[:, L:L + n] = t.tree_mask
    return allowed
