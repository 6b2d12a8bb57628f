"""The EAGLE-2 tree in the graph: frontier selection, rerank to the budget, chain-first order, tree tensors.

Graph code with fixed shapes (B batch, k = top_k, D = max_depth, M = budget, N = M + 1, P = M). The host
reference is eagle_ms/drafting.py (``build_tree``) + eagle_ms/tree.py (``chain_first``, ``tensorize``);
``TreeGrowth`` reproduces them exactly (tests/test_draft_tree_step.py compares every field), except that
scores are float32 sums here and float64 sums there.

Candidates in creation order (as ``build_tree`` numbers them): ids 0..k-1 are depth 1 (the root pair's
top-k, in top-k order); depth t+1 adds a block of k^2 ids, frontier row r's children at r*k .. r*k+k-1 of
it. In all ``n_c = k + (D-1) k^2`` candidates (e.g. 46 for k = 2, D = 12). All depths always run: the
host's exact early stop only skips expansions that cannot change the result, and the min_path_prob cut
marks the candidates of the depths after the cut invalid, which equals the host's ``break``.

Ranking key everywhere: score descending, then creation index ascending, computed without a sort by
pairwise comparison: ``rank[i] = #{j : j beats i}``, j beats i iff (valid_j and not valid_i) or (same
validity and (s_j > s_i or (s_j == s_i and j < i))). It is a permutation of 0..n-1; the top q are the ids
of ranks < q, listed by rank. Example: scores [-1, -0.5, -1], all valid -> ranks [1, 0, 2].

Chain-first preorder without a traversal. The draft's top-K is sorted (descending), so a candidate's
rank among its siblings (score descending, ties lower id, as ``chain_first`` sorts them) is its column
c in its row: clamped log-probs stay non-increasing and adding them to the same parent score keeps that
order. A candidate's signature ``sig [D]`` lists the columns of its ancestors-or-self, depth 1 first,
-1 past its depth. Depth-first preorder with the best child first is the lexicographic order of
signatures (an ancestor is a prefix and comes first, since -1 < every column), so node id = 1 + #(kept
candidates with a smaller signature). Example (k = 2, budget 3, the worked example of
eagle_ms/drafting.py): kept #0 (sig [0, -1]), #2 (child 0 of #0: [0, 0]), #3 (child 1 of #0: [0, 1])
-> node ids 1, 2, 3.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops


def _const(array, dtype=np.int32) -> Tensor:
    return Tensor(np.asarray(array, dtype))


def _earlier(n: int) -> Tensor:
    """[1, n(i), n(j)] bool constant: j < i."""
    return Tensor(np.tril(np.ones((n, n), bool), -1)[None])


def count(flags, axis: int = -1):
    """flags bool -> the number of True along ``axis``, int32 (one cast and one int32 sum).
    Example: [[True, False, True]] -> [2]."""
    return flags.astype(ms.int32).sum(axis, dtype=ms.int32)


def index_of(hit, ids):
    """hit [..., n] bool with at most one True per row, ids [n] int32 -> that True's id (0 if none), int32.
    Example: [[False, True, False]], ids [0, 1, 2] -> [1]."""
    return ops.where(hit, ids, 0).sum(-1, dtype=ms.int32)


def stable_rank(scores, valid, earlier):
    """scores [B, n] f32, valid [B, n] bool (None: all valid), earlier = ``_earlier(n)`` -> rank [B, n]
    int32 (module doc: valid first, score descending, then index ascending).
    Example: [-1, -0.5, -1, 0, -0.5], valid [T, T, T, F, T] -> [2, 0, 3, 4, 1]."""
    s_i, s_j = ops.expand_dims(scores, 2), ops.expand_dims(scores, 1)       # i rows, j columns
    beats = (s_j > s_i) | ((s_j == s_i) & earlier)                           # [B, n(i), n(j)]
    if valid is not None:
        v_i, v_j = ops.expand_dims(valid, 2), ops.expand_dims(valid, 1)
        beats = (v_j & ~v_i) | ((v_j == v_i) & beats)
    return count(beats)


def first_by_rank(rank, q: int, ids):
    """rank [B, n] (a permutation), ids [n] = arange(n) -> the ids of ranks 0..q-1 [B, q] int32, best first."""
    hit = ops.expand_dims(rank, 1) == ids[:q].reshape(1, q, 1)               # [B, q, n]
    return index_of(hit, ids)


def lex_less(sig):
    """sig [B, n, D] int32 -> less [B, n(u), n(v)] bool: sig_u < sig_v lexicographically."""
    su, sv = ops.expand_dims(sig, 2), ops.expand_dims(sig, 1)                 # [B, n, 1, D], [B, 1, n, D]
    differs = (su != sv).astype(ms.int32)
    before = ops.cumsum(differs, -1) - differs                                # differences before level d
    return ((before == 0) & (su < sv)).any(-1)


class TreeGrowth(nn.Cell):
    """Grow (``start``, then ``grow`` at depths 1..D-1), rerank and tensorize (``finish``) in the graph.

    A growth state is ``(blocks, frontier)``. ``blocks``: one tuple per depth of its candidates'
    (scores [B, n_t] f32, tokens [B, n_t] i32, parents [B, n_t] i32 (candidate id, -1 = root),
    valid [B, n_t] bool, sig [B, n_t, D] i32). ``frontier``: (candidate ids [B, k], scores [B, k],
    tokens [B, k], sig [B, k, D], alive [B] bool). ``min_path_prob`` p > 0: a depth's children exist only
    while every depth so far had a frontier score >= log p (host: ``build_tree``'s break). ``levels``
    (>= max_depth, default max_depth): the D of the output tensors (ancestors [B, D+1, N], paths
    [B, P, D+1]); a shallow tree grows fewer depths than its tensors hold.
    """

    def __init__(self, budget: int, max_depth: int, top_k: int, min_path_prob: float = 0.0,
                 levels: int | None = None):
        super().__init__()
        m, d, k = budget, max_depth, top_k
        self.m, self.d, self.k = m, d, k
        self.levels = d if levels is None else levels
        self.cut = float(np.log(min_path_prob)) if min_path_prob > 0 else None
        n_c = k + (d - 1) * k * k
        depth = [1] * k + [t for t in range(2, d + 1) for _ in range(k * k)]
        self.cand_depth = _const([depth])                                     # [1, n_c]
        self.level_of = [Tensor(np.arange(d) == t) for t in range(d)]         # [D] bool: level t
        self.sig1 = _const(np.where(np.arange(d)[None] == 0, np.arange(k)[:, None], -1)[None])  # [1, k, D]
        self.child_col = _const(np.tile(np.arange(k), k)[None, :, None])      # [1, k^2, 1]: c of child r*k+c
        self.child_row = _const(np.repeat(np.arange(k), k))                   # [k^2]: r of child r*k+c
        self.ids_kk = _const(np.arange(k * k))
        self.ids_k = _const(np.arange(k).reshape(1, k))                      # [1, k]
        self.ids_c = _const(np.arange(n_c))
        self.earlier_kk, self.earlier_c = _earlier(k * k), _earlier(n_c)
        self.ids_n = _const(np.arange(m + 1))                                 # [N]
        self.node_ids = _const(np.arange(m + 1).reshape(1, m + 1, 1))         # [1, N, 1]
        self.path_rows = _const(np.arange(m).reshape(1, m, 1))                # [1, P, 1]
        self.not_root_col = Tensor((np.arange(m + 1) > 0).reshape(1, m + 1, 1))  # [1, N, 1]
        self.eye_n = Tensor(np.eye(m + 1, dtype=bool)[None])                  # [1, N, N]
        self.not_root = Tensor(np.arange(m + 1) > 0)                          # [N]
        self.levels_1 = _const(np.arange(self.levels + 1))                    # [D+1]

    def start(self, root_logprob, root_ids):
        """root_logprob, root_ids [B, K >= k] (top-K, descending) -> the state after depth 1."""
        k = self.k
        if root_logprob.shape[-1] != k:  # the draft's top-K is wider than k: its first k columns
            root_logprob, root_ids = root_logprob[:, :k], root_ids[:, :k]
        scores = ops.minimum(root_logprob, 0.0)                               # [B, k]; log p <= 0
        b = scores.shape[0]
        sig = ops.broadcast_to(self.sig1, (b, k, self.d))
        ids = ops.broadcast_to(self.ids_k, (b, k))
        block = (scores, root_ids, ops.full((b, k), -1, dtype=ms.int32), ops.ones((b, k), ms.bool_), sig)
        return (block,), (ids, scores, root_ids, sig, ops.ones((b,), ms.bool_))

    @staticmethod
    def frontier_tokens(state):
        """The frontier candidates' tokens [B, k]: the next expand call's input ids."""
        return state[1][2]

    def grow(self, state, depth: int, logprob, target_ids):
        """Children of the frontier at ``depth`` (they have depth + 1) from that depth's expand call,
        logprob [B, k rows, K] f32, target_ids [B, k, K] i32. Returns (state, parent_rows [B, k]): the
        rows of this call that the new frontier nodes are children of (host: ``top // k``)."""
        blocks, (front, front_scores, _, front_sig, alive) = state
        k, b = self.k, front.shape[0]
        n = k + (depth - 1) * k * k                                           # candidates made so far
        if self.cut is not None:
            alive = alive & (ops.amax(front_scores, -1) >= self.cut)
        if logprob.shape[-1] != k:  # the draft's top-K is wider than k: its first k columns
            logprob, target_ids = logprob[:, :, :k], target_ids[:, :, :k]
        scores = (ops.expand_dims(front_scores, 2) + ops.minimum(logprob, 0.0)).reshape(b, k * k)
        tokens = target_ids.reshape(b, k * k)
        sig = ops.where(self.level_of[depth], self.child_col, ops.gather(front_sig, self.child_row, 1))
        top = first_by_rank(stable_rank(scores, None, self.earlier_kk), k, self.ids_kk)  # [B, k] in 0..k^2-1
        block = (scores, tokens, ops.gather(front, self.child_row, 1),
                 ops.broadcast_to(ops.expand_dims(alive, 1), (b, k * k)), sig)
        frontier = (top + n, ops.gather_elements(scores, 1, top), ops.gather_elements(tokens, 1, top),
                    ops.gather(sig, top, 1, batch_dims=1), alive)
        return (blocks + (block,), frontier), ops.floor_div(top, k)

    def finish(self, state, committed_len, root_token):
        """Rerank to M, chain-first node ids, tree tensors at committed length L' [B] for root [B].

        Returns (tokens, parent, depth, valid, ancestors [B, D+1, N], position_ids, cache_slots,
        tree_mask [B, N, N], paths [B, P, D+1], path_lengths [B, P], num_paths [B], scores [B, N]),
        equal to eagle_ms/tree.py ``tensorize(chain_first(tree), L', M, D)`` of the host tree.
        """
        blocks = state[0]
        scores, tokens, parents, valid, sig = (ops.concat([blk[i] for blk in blocks], 1) for i in range(5))
        b = scores.shape[0]
        kept = valid & (stable_rank(scores, valid, self.earlier_c) < self.m)   # [B, n_c]
        earlier = lex_less(sig) & ops.expand_dims(kept, 2)                    # [B, n_c(u), n_c(v)]
        node = ops.where(kept, count(earlier, 1) + 1, 0)                      # [B, n_c]: 0 = not kept
        hit = (ops.expand_dims(node, 1) == self.node_ids) & self.not_root_col  # [B, N, n_c]
        cand = index_of(hit, self.ids_c)                                      # [B, N]: node n's candidate (or 0)
        real = hit.any(-1)                                                    # a kept candidate (not root/pad)
        par = ops.gather_elements(parents, 1, cand)
        parent = ops.where(real & (par >= 0), ops.gather_elements(node, 1, ops.maximum(par, 0)), 0)
        root = ops.where(self.not_root, 0, root_token.reshape(b, 1))          # [B, N]: root token at node 0
        tok = ops.where(real, ops.gather_elements(tokens, 1, cand), root)
        is_node = real | ~self.not_root
        depth = ops.where(real, ops.gather_elements(ops.broadcast_to(self.cand_depth, scores.shape), 1, cand), 0)
        score = ops.where(real, ops.gather_elements(scores, 1, cand), 0.0)
        return self.tensors(tok, parent, depth, is_node, committed_len) + (score,)

    def tensors(self, tokens, parent, depth, valid, committed_len):
        """Node arrays [B, N] -> the tree tensors of eagle_ms/tree.py ``tensorize`` (all but scores)."""
        b, n = parent.shape
        ids = self.ids_n
        levels = [ops.broadcast_to(ids.reshape(1, n), (b, n))]                 # A[0, k] = k
        for _ in range(self.levels):
            levels.append(ops.gather_elements(parent, 1, levels[-1]))         # A[l+1, k] = parent[A[l, k]]
        ancestors = ops.stack(levels, 1)                                      # [B, D+1, N]
        seen = (ops.expand_dims(ancestors, 3) == ids).any(1)                 # [B, N(k), N(j)]
        mask = (seen & ops.expand_dims(valid, 2) & ops.expand_dims(valid, 1)) | self.eye_n
        paths, lengths, num_paths = self.leaf_paths(parent, depth, valid, ancestors)
        start = committed_len.reshape(b, 1)
        return (tokens, parent, depth, valid, ancestors, start + depth, start + ids.reshape(1, n),
                mask, paths, lengths, num_paths)

    def leaf_paths(self, parent, depth, valid, ancestors):
        """Root-to-leaf rows in ascending leaf id (eagle_ms/tree.py ``_leaf_paths``): row r of leaf q of
        depth d is paths[r, i] = A[max(d - i, 0), q]; unused rows 0 with length 0.
        Example: leaves 2 (depth 1) and 3 (A[:, 3] = [3, 1, 0]), D = 2 -> [0, 2, 2], [0, 1, 3]."""
        ids = self.ids_n
        child_of = (ops.expand_dims(parent, 2) == ids) & ops.expand_dims(valid & self.not_root, 2)  # [B, N(child), N]
        leaf = valid & ~child_of.any(1)                                       # [B, N]
        leaf_i = leaf.astype(ms.int32)
        before = ops.cumsum(leaf_i, 1) - leaf_i                               # leaves with a smaller id
        hit = ops.expand_dims(leaf, 1) & (ops.expand_dims(before, 1) == self.path_rows)  # [B, P, N]
        leaf_id = index_of(hit, ids)                                          # [B, P]; 0 for unused rows
        used = hit.any(-1)
        leaf_depth = ops.gather_elements(depth, 1, leaf_id)
        level = ops.maximum(ops.expand_dims(leaf_depth, 2) - self.levels_1, 0)  # [B, P, D+1]
        chains = ops.gather(ancestors.swapaxes(1, 2), leaf_id, 1, batch_dims=1)  # [B, P, D+1]: A[:, leaf]
        paths = ops.where(ops.expand_dims(used, 2), ops.gather_elements(chains, 2, level), 0)
        lengths = ops.where(used, leaf_depth + 1, 0)
        return paths, lengths, leaf_i.sum(-1, dtype=ms.int32)
