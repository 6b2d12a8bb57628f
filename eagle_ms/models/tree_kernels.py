"""KernelTreeGrowth: ``TreeGrowth``'s interface (eagle_ms/models/tree_graph.py) on three CPU kernels.

The composite ``TreeGrowth`` grows, reranks and tensorizes the EAGLE-2 tree with about 22 small MindSpore
kernels per expansion depth and about 90 more for the rerank and the tree tensors (490 kernels for the
demo pair's whole draft tree graph, about half of them bookkeeping). On the CPU runtime every launch
costs a fixed few microseconds, so here each depth is one ``TreeGrow`` kernel and the rerank plus the
tree tensors one ``TreeFinish`` kernel (eagle_ms/models/tree_kernels.cc, built with cpu_kernels.cc).
The outputs are the composite form's exactly (tests/test_tree_kernels.py runs both on the same grid
against eagle_ms/drafting.py ``build_tree``). Used by ``DraftTreeStep`` when the draft runs the fused
CPU kernels (``runtime.kernels``); every other device keeps the composite form. There the draft tree
kernel (``DraftTree``, eagle_ms/models/draft_kernels.cc) grows every depth itself with the same per-row
bookkeeping (``tree_math.h``, which ``TreeStart``/``TreeGrow`` also run), so the step calls only ``finish``
(and ``start`` for a tree of depth 1); ``start``/``grow`` are how tests/test_tree_kernels.py checks that
bookkeeping on the full grid with crafted ties.

State between calls (B batch, k = top_k, C = k + (D-1) k^2 candidates in creation order):
``(scores [B,C] f32, ints [B,3,C] i32 (token, parent candidate id or -1, valid), front_scores [B,k] f32,
front_ids [B,k] i32, front_tokens [B,k] i32)``.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn

from eagle_ms.models import cpu_kernels


class KernelTreeGrowth(nn.Cell):
    """``start``, ``grow`` at depths 1..D-1, ``finish``: the contract of ``tree_graph.TreeGrowth`` (``levels``
    included: the finish kernel reads the tensors' D from its layout constant)."""

    def __init__(self, budget: int, max_depth: int, top_k: int, min_path_prob: float = 0.0,
                 levels: int | None = None):
        super().__init__()
        d, k = max_depth, top_k
        levels = d if levels is None else levels  # the D of the output tensors (>= max_depth)
        self.k = k
        candidates = k + (d - 1) * k * k
        cut = np.log(min_path_prob) if min_path_prob > 0 else -np.inf
        self.cut = Tensor(np.array([cut], np.float32))
        # depth t's children are candidates k + (t-1) k^2 .. k + t k^2 - 1
        self.first = [Tensor(np.array([k + (t - 1) * k * k], np.int32)) for t in range(1, d)]
        # shape carriers: the kernels read the sizes from these constants' shapes, never their values
        self.start_layout = Tensor(np.zeros((k, candidates), np.int32))          # [k, C]
        self.finish_layout = Tensor(np.zeros((levels + 1, budget + 1), np.int32))  # [D+1, N]
        self.start_op = cpu_kernels.tree_start_op()
        self.grow_op = cpu_kernels.tree_grow_op()
        self.finish_op = cpu_kernels.tree_finish_op()

    def start(self, root_logprob, root_ids):
        """root_logprob [B, K >= k] f32, root_ids [B, K] i32 (top-K, descending) -> the state after depth 1."""
        return self.start_op(root_logprob, root_ids.astype(ms.int32), self.start_layout)

    @staticmethod
    def frontier_tokens(state):
        """The frontier candidates' tokens [B, k]: the next expand call's input ids."""
        return state[4]

    def grow(self, state, depth: int, logprob, target_ids):
        """The children of the frontier at ``depth`` from that depth's expand call (logprob [B,k,K] f32,
        target_ids [B,k,K] i32) -> (state, parent_rows [B, k]): the rows of this call the new frontier
        nodes are children of."""
        scores, ints, front_scores, front_ids, _ = state
        out = self.grow_op(scores, ints, front_scores, front_ids, logprob, target_ids.astype(ms.int32),
                           self.first[depth - 1], self.cut)
        return out[:5], out[5]

    def finish(self, state, committed_len, root_token):
        """Rerank to M, chain-first node ids, the tree tensors at committed length L' [B] for root [B]
        (``TreeGrowth.finish``'s 12 outputs)."""
        return self.finish_op(state[0], state[1], root_token.astype(ms.int32), committed_len.astype(ms.int32),
                              self.finish_layout)
