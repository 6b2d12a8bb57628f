"""DraftTreeStep: one graph call per speculative step drafts the whole EAGLE-2 tree on the device.

Contract (issue #15, shared with the verify graph; B batch, D = max_depth, k = top_k, M = budget,
N = M + 1, P = M, X = scratch slots, C = committed capacity, W = the attention window of this instance):

    construct(result [B, 2D+3] i32, accepted_aux [B, D+1, 3Ht], committed_len [B] i32)
      -> (tokens [B,N] i32, parent [B,N] i32, depth [B,N] i32, valid [B,N] bool, ancestors [B,D+1,N] i32,
          position_ids [B,N] i32, cache_slots [B,N] i32, tree_mask [B,N,N] bool, paths [B,P,D+1] i32,
          path_lengths [B,P] i32, num_paths [B] i32, scores [B,N] f32)

``result`` is the previous verify's packed result: col 0 = A (accepted drafts; -1 = no step yet, after
``Eagle3Drafter.begin``), cols 1..D+1 = the emitted tokens (A drafts, the bonus, 0-padding), cols D+2..
= accepted node ids (unused here). ``accepted_aux`` = the accepted nodes' teacher features, root first.
``committed_len`` L = draft pairs committed before this call (the teacher's length before that verify's
commit). The tree is for the teacher at L' = L + A + 1 and equals eagle_ms/tree.py
``tensorize(chain_first(build_tree(...).tree), L', M, D)`` of the host path (eagle_ms/eagle3_drafter.py),
scores to float32 rounding (eagle_ms/models/tree_graph.py).

In the graph (the draft-cache layout of eagle_ms/eagle3_drafter.py: scratch [0, X), pair j at X + j):
  1. extend: the A+1 pairs (f_{L+i}, t_i) (f = accepted_aux rows, t = emitted tokens) at slots X+L+i,
     positions L+i, in D+1 rows; padding rows (i > A) write scratch slot i, position L, token 0, and see
     only themselves. Row i sees pairs [max(L+i+1-w, 0), L+i+1) (w = context_window, else all).
  2. root pair: row A's (token, top-K, hidden), or the stored one when A = -1; stored again
     (``Eagle3Draft.root_pair``).
  3. depths 1..D-1: one k-row draft call each (frontier row r at depth t: token its own, feature its
     parent's hidden (depth 1: the root pair's), position L'-1+t, scratch slot (t-1)k + r; it sees pairs
     [max(L'-w, 0), L'), its ancestors' scratch slots and itself), then ``TreeGrowth.grow``.
  4. ``TreeGrowth.finish``: rerank to M, chain-first node ids, the tree tensors.
A depth's mask row is its parent row's plus its own scratch slot (the parent's row already holds the
committed pairs and the parent's ancestors' slots), so each depth's inputs are two gathers and an or.
With the fused CPU kernels (``Eagle3Draft.kernels`` 'cpu') step 3 is one kernel, ``DraftTree``
(eagle_ms/models/draft_kernels.cc: every depth's layer, its attention over the cache read in place and the
tree's own K/V kept in the kernel, ``TreeGrowth.grow``'s bookkeeping, and the exact early stop of
``drafting.build_tree``: the depths that cannot change the tree are not run), and step 4 is
``KernelTreeGrowth.finish`` (eagle_ms/models/tree_kernels.py), with the same outputs: the host path's
expand calls run the same layer code (``DraftFront``, ``DraftBack``), so the two trees are the same bits.
The extend's row inputs, flat cache rows, A, max(A + 1, 0) and L' come from one kernel (``ExtendInputs``),
and ``RootPair`` stores the root pair in place (no Assign kernels; docs/architecture.md § "Kernels that
write Parameters, and the early stop in ``DraftTree``").
Worked example (X = 24, L = 10, A = 2, D = 4): extend rows 0..2 write slots 34, 35, 36 (positions 10..12),
rows 3, 4 write scratch slots 3, 4; L' = 13; depth-2 row 1 writes scratch slot k + 1 at position 13.

Attention reads cache slots [0, X + W) (W = ``window``, one graph per window as the teacher's); the host
picks the instance with W >= L' (eagle_ms/device_drafter.py). Indices are in range by construction:
slots are clamped to the cache, gathers index fixed-size tables with ids < their size.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops

from eagle_ms.models import cpu_kernels
from eagle_ms.models.eagle3 import Eagle3Draft
from eagle_ms.models.fixed_call import FixedSignatureCall
from eagle_ms.models.kv_cache import flat_rows
from eagle_ms.models.layers import fused_kernel
from eagle_ms.models.tree_graph import TreeGrowth
from eagle_ms.models.tree_kernels import KernelTreeGrowth

OUTPUT_NAMES = ("tokens", "parent", "depth", "valid", "ancestors", "position_ids", "cache_slots", "tree_mask",
                "paths", "path_lengths", "num_paths", "scores")


# Local copies of eagle_ms/models/step_result.py's layout helpers (same names; owned by the verify graph).
ACCEPTED_COLUMN = 0


def result_width(max_depth: int) -> int:
    """Columns of the packed step result: A, D+1 emitted tokens, D+1 node ids. Example: D = 12 -> 27."""
    return 2 * (max_depth + 1) + 1


def token_columns(max_depth: int) -> slice:
    """Columns of the emitted tokens: 1 .. D+1. Example: max_depth 3 -> slice(1, 5)."""
    return slice(1, max_depth + 2)


class DraftTreeStep(FixedSignatureCall, nn.Cell):
    """The draft graph of one speculative step (module doc). ``params``: eagle_ms/drafting.py TreeParams
    (any object with budget, max_depth, top_k, min_path_prob). Shares ``draft``'s weights and cache.

    ``tensor_depth`` (default ``params.max_depth``): the D of the input result and the output tensors. A
    shallow tree (``speculative.shallow_depth``, eagle_ms/depth_policy.py) grows ``params.max_depth`` <
    D depths but keeps the D-shaped contract, so it takes and gives the same packed results as the
    full tree's graph and the two can alternate step by step."""

    def __init__(self, draft: Eagle3Draft, params, context_window: int | None, committed_capacity: int,
                 window: int, tensor_depth: int | None = None):
        super().__init__(auto_prefix=False)  # never rename the draft's (or the shared teacher's) parameters
        self.d = params.max_depth if tensor_depth is None else tensor_depth  # D of the tensors
        self.grown, self.k = params.max_depth, params.top_k                   # depths drafted
        if not 1 <= self.grown <= self.d:
            raise ValueError(f"tree depth {self.grown} must be in [1, tensor depth {self.d}]")
        self.scratch = draft.capacity - committed_capacity  # X
        need = max((self.grown - 1) * self.k, self.d + 1)
        if self.scratch < need:
            raise ValueError(f"draft cache capacity {draft.capacity} leaves {self.scratch} scratch slots past "
                             f"the committed capacity {committed_capacity}; the tree step needs {need}")
        if not 1 <= window <= committed_capacity:
            raise ValueError(f"attention window {window} must be in [1, committed capacity {committed_capacity}]")
        if draft.top_k < self.k:
            raise ValueError(f"config key 'speculative.top_k' = {self.k}: the draft graph was built with top_k "
                             f"{draft.top_k} (its in-graph top-K must be >= k)")
        if context_window is not None and context_window < 1:
            raise ValueError(f"config key 'speculative.draft_window' = {context_window}: must be >= 1 or null")
        self.draft, self.window, self.context_window = draft, window, context_window
        self.width = self.scratch + window  # mask width: slots [0, X + W)
        # the tree bookkeeping: one CPU kernel per depth + one for the rerank and tensors with the fused
        # kernels (eagle_ms/models/tree_kernels.py), else the composite ops (same outputs)
        growth = KernelTreeGrowth if draft.kernels == "cpu" else TreeGrowth
        self.growth = growth(params.budget, self.grown, self.k, params.min_path_prob, levels=self.d)
        self.rows = Tensor(np.arange(self.d + 1, dtype=np.int32)[None])       # [1, D+1] extend rows
        self.depth_offsets = Tensor(np.arange(self.grown - 1, dtype=np.int32)[None])  # [1, D-1]: depth t -> t-1
        self.columns = Tensor(np.arange(self.width, dtype=np.int32))          # [X+W] cache slots read
        # expansion at depth t, row r -> scratch slot (t-1)k + r: its mask column and its cache rows
        slots = [(t - 1) * self.k + np.arange(self.k) for t in range(1, self.grown)]
        self.own = [Tensor((np.arange(self.width) == s[:, None])[None]) for s in slots]  # [1, k, X+W] bool
        # the fused CPU kernels with attention over the cache in place: every expansion depth in one kernel
        self.tree_kernel = cpu_kernels.draft_tree_op() if draft.midlayer.self_attn.window_in_place else None
        self.tree_settings = Tensor(np.array([self.scratch, context_window or 0, params.budget], np.int32))
        self.extend_kernel = fused_kernel(draft.kernels, cpu_kernels.extend_inputs_op)
        self.root_kernel = fused_kernel(draft.kernels, cpu_kernels.root_pair_op)
        self.extend_settings = Tensor(np.array([self.scratch, draft.capacity, context_window or 0], np.int32))
        heads, b = draft.config.num_key_value_heads, draft.batch
        self.head_layout = Tensor(np.zeros(heads, np.int32))  # its shape tells ExtendInputs Hkv
        self.cache_rows = [flat_rows(Tensor(np.tile(s[None], (b, 1)).astype(np.int32)), heads, draft.capacity)
                           for s in slots]                                    # [B*Hkv*k] int32 each

    def construct(self, result, accepted_aux, committed_len):
        logprob, ids, hidden, caches, length = self.extend(result, accepted_aux, committed_len)
        root = self.root_pair(result, logprob, ids, hidden)
        return self.draft_tree(root, length, caches)

    def visible(self, upto):
        """upto [B, n] -> [B, n, X+W] bool: committed pairs [lo, upto) with lo by ``context_window``."""
        pair = self.columns - self.scratch                                   # column -> pair (< 0: scratch)
        upto = upto[:, :, None]
        lo = ops.zeros_like(upto) if self.context_window is None else ops.maximum(upto - self.context_window, 0)
        return (pair >= lo) & (pair < upto)

    def extend(self, result, accepted_aux, committed_len):
        """Commit pairs L .. L+A in one (D+1)-row extend call (module doc, step 1); returns (logprob, ids,
        hidden, the caches the tree reads, L' = L + A + 1 [B]). With the fused CPU kernels the rows' inputs,
        their flat cache rows, A, max(A + 1, 0) and L' come from one kernel (``ExtendInputs``), and the layer
        kernels skip the padding rows (the draft's ``real_rows``) and compute the layer's outputs for row A
        alone (the only row ``root_pair`` keeps)."""
        if self.extend_kernel is not None and self.draft.kernel_extends(self.d + 1):
            ids, positions, rows, allowed, accepted, real, length = self.extend_kernel(
                result, committed_len, self.extend_settings, self.columns, self.head_layout)
            # only row A's outputs are kept (root_pair): the other rows only write their K/V
            out, caches = self.draft.kernel_layer(True, ids, accepted_aux, positions, rows, allowed, real, accepted)
            return (*out, caches, length)
        accepted = result[:, ACCEPTED_COLUMN]                                # [B] A (-1: no step yet)
        emitted = result[:, token_columns(self.d)]                           # [B, D+1]
        b = emitted.shape[0]
        rows = ops.broadcast_to(self.rows, (b, self.d + 1))                  # [B, D+1]
        start = committed_len.reshape(b, 1).astype(ms.int32)
        real = rows <= accepted[:, None]
        ids = ops.where(real, emitted, 0)
        positions = ops.where(real, start + rows, start)
        slots = ops.minimum(ops.where(real, self.scratch + start + rows, rows), self.draft.capacity - 1)
        own = self.columns[None, None, :] == slots[:, :, None]
        allowed = self.visible(ops.where(real, start + rows + 1, 0)) | own  # a real row sees up to itself
        length = committed_len + accepted + 1
        return (*self.draft(ids, accepted_aux, positions, slots, allowed), self.cache_parameters(), length)

    def cache_parameters(self):
        """The draft cache's (k, v) Parameters [B*Hkv*S, Dh]."""
        cache = self.draft.midlayer.self_attn.kv_cache
        return cache.k_cache, cache.v_cache

    def root_pair(self, result, logprob, ids, hidden):
        """(token [B], top-K logprob [B,K], target ids [B,K], hidden [B,H]) of the new last pair, kept; the
        selection in one kernel (``RootPair``) with the fused CPU kernels."""
        store = self.draft.root_pair
        if self.root_kernel is not None:  # the kernel also overwrites the stored pair in place
            return self.root_kernel(result, logprob, ids, hidden, store.token, store.logprob, store.target_ids,
                                    store.hidden)
        accepted = result[:, ACCEPTED_COLUMN]                                # [B] A (-1: no step yet)
        emitted = result[:, token_columns(self.d)]                           # [B, D+1]
        fresh = accepted >= 0                                                # [B]
        row = ops.maximum(accepted, 0).reshape(-1, 1)                        # [B, 1]
        token = ops.where(fresh, ops.gather_elements(emitted, 1, row)[:, 0], store.token)
        pick = fresh[:, None]
        lp = ops.where(pick, ops.gather(logprob, row, 1, batch_dims=1)[:, 0], store.logprob)
        tid = ops.where(pick, ops.gather(ids, row, 1, batch_dims=1)[:, 0], store.target_ids)
        hid = ops.where(pick, ops.gather(hidden, row, 1, batch_dims=1)[:, 0], store.hidden)
        return store.keep(token, lp, tid, hid)

    def draft_tree(self, root, length, caches):
        """Grow depths 1..D from the root pair at committed length L' [B]; the tree tensors (steps 3-4).
        ``caches``: the draft cache (k, v) as the extend left it (read by the tree kernel)."""
        token, logprob, target_ids, hidden = root
        if self.tree_kernel is not None and self.grown > 1:
            return self.growth.finish(self.kernel_tree(logprob, target_ids, hidden, length, caches), length, token)
        b, k = hidden.shape[0], self.k
        state = self.growth.start(logprob, target_ids)
        feats = ops.broadcast_to(hidden[:, None, :], (b, k, hidden.shape[-1]))  # [B, k, H]
        start = ops.broadcast_to(length.reshape(b, 1), (b, k))               # [B, k]
        tables = self.rotary_tables(length)
        mask = self.visible(start) | self.own[0] if self.grown > 1 else None  # [B, k, X+W]
        for depth in range(1, self.grown):
            lp, ids, hid = self.expand(depth, self.growth.frontier_tokens(state), feats, tables[depth - 1], mask)
            state, parent_rows = self.growth.grow(state, depth, lp, ids)
            if depth + 1 < self.grown:
                feats, mask = self.frontier_inputs(hid, mask, parent_rows, depth + 1)
        return self.growth.finish(state, length, token)

    def kernel_tree(self, logprob, target_ids, hidden, length, caches):
        """Depths 1..D-1 in one kernel (``cpu_kernels.DraftTree``) from the root pair's top-K [B, K] and hidden
        [B, H] at L' [B]: the candidate tables (scores [B, C], ints [B, 3, C]) for ``growth.finish``. Depth t's
        rows are at position L'-1+t; the kernel makes their rotary tables from ``Rotary.inv_freq``."""
        return self.tree_kernel(logprob, target_ids.astype(ms.int32), hidden, length.astype(ms.int32),
                                self.draft.rotary.inv_freq, *caches, self.tree_settings, self.growth.cut,
                                self.growth.start_layout, *self.draft.kernel_weights())

    def frontier_inputs(self, hidden, mask, parent_rows, depth: int):
        """The expand inputs of ``depth`` (>= 2) from depth-1's call: row r's feature is its parent row's
        hidden [B, k, H]; its mask [B, k, X+W] is its parent row's (committed pairs, the parent's ancestors'
        scratch slots and the parent's own) plus its own scratch slot."""
        feats = ops.gather(hidden, parent_rows, 1, batch_dims=1)
        return feats, ops.gather(mask, parent_rows, 1, batch_dims=1) | self.own[depth - 1]

    def rotary_tables(self, length):
        """The rotary head tables (cos, sin) of depths 1..D-1 (position L'-1+t, shared by the depth's k rows),
        computed in one pass: a tuple of D-1 pairs of [B, 1, Hq+2Hkv, Dh] (one rotary call, one
        ``head_tables`` and one split for all depths)."""
        if self.grown == 1:
            return ()
        positions = length.reshape(-1, 1) + self.depth_offsets               # [B, D-1]
        cos, sin = self.draft.midlayer.self_attn.head_tables(*self.draft.rotary(positions))  # [B, D-1, Hq+2Hkv, Dh]
        if self.grown == 2:
            return ((cos, sin),)
        return tuple(zip(ops.split(cos, 1, 1), ops.split(sin, 1, 1)))

    def expand(self, depth: int, tokens, feats, table, mask):
        """One k-row draft step at ``depth`` (``Eagle3Draft.step`` with this depth's constant cache rows and
        rotary ``table`` (cos, sin))."""
        draft = self.draft
        cos, sin = table
        hidden, normed = draft.layer_rotated(tokens, feats.astype(draft.fc.weight.dtype), cos, sin,
                                             self.cache_rows[depth - 1], mask)
        logprob, ids = draft.topk_normed(normed)
        return logprob, ids, hidden.astype(ms.float32)
