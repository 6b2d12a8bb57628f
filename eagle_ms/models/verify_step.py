"""The verify graph of one speculative step: tree-masked teacher forward, greedy accept, accepted aux rows.

One call of ``VerifyStep`` (per attention window W; the host picks the instance) does, in one graph:

    allowed  = verify_mask(committed_len, tree_mask, W)          [B, N, W]  (== tree.verify_attention_mask)
    teacher forward over the N tree rows, K/V written at slots L + node id  (PanguForCausalLM.hidden_states)
    argmax   = argmax of lm_logits                                [B, N]     (never leaves the graph)
    accept   = DeviceAccept(tokens, argmax, paths, path_lengths)            (== verify.greedy_accept)
    -> result [B, 2D+3] int32 (eagle_ms/models/step_result.py), accepted_aux [B, D+1, 3Ht]
       (+ argmax [B, N] int32 when built with reference=True)

With the fused CPU kernels (the teacher's ``kernels`` 'cpu') the mask is one ``VerifyMask`` kernel and the
acceptance, the packing, the aux row ids and the commit one ``GreedyAccept`` kernel
(eagle_ms/models/verify_kernels.cc).

``DecodeStep`` is the teacher-only step (the root alone at slot L): the same outputs from two inputs.

No [B, N, V] or [B, N, 3Ht] tensor is an output. When the accepted path is the chain-first prefix (node
ids 0..A, the common case) the accepted K/V already sit at [L, L+A+1) and nothing moves. An out-of-order
path is moved by ``GreedyAccept`` itself, in place in the teacher's cache Parameters, after every layer
read them (``VerifyStep.commits``); with the composite ops the graph does not commit, and the host calls
the model's ``CacheMover`` graph (``BranchCache.commit_by_path``, eagle_ms/device_verify.py). Why:
docs/architecture.md §"Device-resident step", §"Kernels that write Parameters".
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import ParameterTuple, Tensor, nn, ops

from eagle_ms.config import GREEDY, SamplingParams
from eagle_ms.models import cpu_kernels
from eagle_ms.models.fixed_call import FixedSignatureCall
from eagle_ms.models.kv_cache import flat_rows
from eagle_ms.models.layers import fused_kernel
from eagle_ms.models.sampler import Sampler
from eagle_ms.models.step_result import pack_result


def verify_mask(committed_len, tree_mask, window: int):
    """committed_len [B] int32, tree_mask [B, N, N] bool -> allowed [B, N, window] bool.

    Row k may attend to slots [0, L) and to slot L + j where tree_mask[k, j] (the tree's branch region
    [L, L+N) must fit the window). Example: L = 2, N = 2, tree_mask [[T, F], [T, T]], window 5 ->
    row 0 [T T T F F], row 1 [T T T T F].
    """
    b, n, _ = tree_mask.shape
    cols = ops.arange(window, dtype=ms.int32).reshape(1, 1, window)
    start = committed_len.reshape(b, 1, 1)
    rel = cols - start                                              # [B, 1, W] column - L
    in_branch = ops.logical_and(rel >= 0, rel < n)                  # [B, 1, W]
    index = ops.broadcast_to(ops.clip(rel, 0, n - 1), (b, n, window))
    branch = ops.gather_d(tree_mask.astype(ms.int32), 2, index) > 0  # [B, N, W] tree_mask[k, col - L]
    return ops.logical_or(cols < start, ops.logical_and(in_branch, branch))


def take_rows(values, index):
    """values [B, N], index [B, ...] int32 in [0, N) -> values[b, index[b, ...]] of index's shape."""
    b = index.shape[0]
    return ops.gather_d(values, 1, index.reshape(b, -1)).reshape(index.shape)


class DeviceAccept(nn.Cell):
    """Greedy acceptance in a graph, the rule of ``eagle_ms.verify.greedy_accept``.

    construct(tokens [B,N] i32, argmax [B,N] i32, paths [B,P,D+1] i32, path_lengths [B,P] i32)
      -> (accepted [B] i32, emitted [B,D+1] i32, node_ids [B,D+1] i32), emitted and node_ids 0-padded.
    Rows with path_length 0 (padding) accept 0 drafts; ties go to the lowest path row. Along the best
    path n_0..n_A, emitted[i] = argmax[n_i] for i <= A: the A accepted drafts (tokens[n_{i+1}] ==
    argmax[n_i] by acceptance) then the bonus argmax[n_A].

    Worked example (that of greedy_accept): paths [[0,2,2],[0,1,3]], lengths [2,3], tokens [r,7,8,9],
    argmax [7,9,5,4] -> accepted per path [0, 2] -> A = 2, node_ids [0,1,3], emitted [7,9,4].
    """

    def __init__(self, max_depth: int):
        super().__init__()
        self.max_depth = max_depth

    def construct(self, tokens, argmax, paths, path_lengths):
        b, p, width = paths.shape                                   # width = D + 1
        drafted = take_rows(tokens, paths[:, :, 1:])                # [B, P, D] token at n_i
        predicted = take_rows(argmax, paths[:, :, :-1])             # [B, P, D] argmax at n_{i-1}
        step = ops.arange(1, width, dtype=ms.int32).reshape(1, 1, width - 1)
        ok = ops.logical_and(drafted == predicted, step < path_lengths.reshape(b, p, 1))
        misses = ops.cumsum(ops.logical_not(ok).astype(ms.int32), 2)  # [B, P, D]
        accepted = (misses == 0).astype(ms.int32).sum(2).astype(ms.int32)  # [B, P] leading matches
        best_len = ops.ReduceMax()(accepted, 1)                     # [B] A
        rows = ops.arange(p, dtype=ms.int32).reshape(1, p)
        first = ops.where(accepted == best_len.reshape(b, 1), rows, ops.full_like(rows, p))
        best = ops.ReduceMin()(first, 1)                            # [B] first row of the max
        path = ops.gather_d(paths, 1, ops.broadcast_to(best.reshape(b, 1, 1), (b, 1, width))).reshape(b, width)
        keep = ops.arange(width, dtype=ms.int32).reshape(1, width) <= best_len.reshape(b, 1)  # [B, D+1]
        zero = ops.zeros_like(path)
        node_ids = ops.where(keep, path, zero)
        emitted = ops.where(keep, take_rows(argmax, path), zero)
        return best_len, emitted, node_ids


class TeacherStep(nn.Cell):
    """What the verify and decode graphs share: a ``PanguForCausalLM`` used in place (its caches), the
    attention window W (reads of cache slots [0, W)), the result width (D + 1 rows), the per-node choice
    (``Sampler``: argmax at temperature 0) and the reference flag (also output the choices).
    Built with auto_prefix=False so the teacher's parameter names (its checkpoint keys) stay as they are.
    """

    def __init__(self, teacher, max_depth: int, window: int, reference: bool = False,
                 sampling: SamplingParams = GREEDY):
        super().__init__(auto_prefix=False)
        if not (1 <= window <= teacher.capacity and 1 <= max_depth < teacher.capacity):
            raise ValueError(f"{type(self).__name__} needs 1 <= window ({window}) <= teacher capacity "
                             f"({teacher.capacity}) and 1 <= max_depth ({max_depth}) < capacity")
        self.teacher = teacher
        self.max_depth, self.window, self.reference = max_depth, window, reference
        self.num_kv_heads = teacher.config.num_key_value_heads
        self.capacity = teacher.capacity
        self.choose = Sampler(sampling, teacher.config.vocab_size)


class VerifyStep(FixedSignatureCall, TeacherStep):
    """One speculative step's verify graph over a shared ``PanguForCausalLM`` (its caches, in place).

    construct(tokens [B,N] i32, position_ids [B,N] i32, tree_mask [B,N,N] bool, paths [B,P,D+1] i32,
              path_lengths [B,P] i32, committed_len [B] i32)
      -> (result [B,2D+3] i32, accepted_aux [B,D+1,3Ht]) (+ argmax [B,N] i32 if ``reference``).
    accepted_aux rows 0..A are the accepted nodes' aux features (root first); padded rows repeat the
    root's. ``window`` W: attention reads cache slots [0, W); the caller guarantees L + N <= W.
    Node k's cache slot is L + k (eagle_ms/tree.py ``tensorize``), computed here: one graph input fewer,
    and on the CPU runtime every graph input costs time (docs/teacher_profile.md §"Graph inputs").
    Teacher-only steps (the root alone) use ``DecodeStep``, not N = 1 here.
    """

    def __init__(self, teacher, max_depth: int, window: int, reference: bool = False,
                 sampling: SamplingParams = GREEDY):
        super().__init__(teacher, max_depth, window, reference, sampling)
        self.accept = DeviceAccept(max_depth)
        # with the fused CPU kernels: the mask in one kernel, and acceptance + packing + aux row ids in one
        # (eagle_ms/models/verify_kernels.cc; the same results as verify_mask / DeviceAccept)
        self.mask_kernel = fused_kernel(teacher.kernels, cpu_kernels.verify_mask_op)
        self.accept_kernel = fused_kernel(teacher.kernels, cpu_kernels.greedy_accept_op)
        self.window_layout = Tensor(np.zeros(window, np.int32))  # its shape tells VerifyMask W
        # the kernel also commits by path in place: every layer's K and V, flat layout (Hkv, S)
        self.cache_shape = Tensor(np.array([self.num_kv_heads, self.capacity], np.int32))
        self.caches = ParameterTuple([p for c in teacher.caches() for p in (c.k_cache, c.v_cache)])

    @property
    def commits(self) -> bool:
        """True when the graph itself moves an out-of-order accepted path's K/V to [L, L+A+1) (the fused
        CPU kernels); else the host commits with the model's ``CacheMover`` (eagle_ms/cache.py)."""
        return self.accept_kernel is not None

    def construct(self, tokens, position_ids, tree_mask, paths, path_lengths, committed_len):
        b, n = tokens.shape
        if self.mask_kernel is not None:
            allowed = self.mask_kernel(committed_len, tree_mask, self.window_layout)  # [B, N, W]
        else:
            allowed = verify_mask(committed_len, tree_mask, self.window)          # [B, N, W]
        slots = committed_len.reshape(b, 1) + ops.arange(n, dtype=ms.int32).reshape(1, n)  # [B, N] L + node id
        rows = flat_rows(slots, self.num_kv_heads, self.capacity)
        hidden, aux = self.teacher.hidden_states(tokens, position_ids, rows, allowed)  # [B,N,H], [B,N,3Ht]
        # the teacher's token after node k, at position position_ids[k] + 1: argmax or the keyed sample
        argmax = self.choose(self.teacher.lm_logits(hidden), position_ids + 1)       # [B, N] int32
        result, accepted_aux = self.accept_rows(tokens, argmax, aux, paths, path_lengths, committed_len)
        if self.reference:
            return result, accepted_aux, argmax
        return result, accepted_aux

    def accept_rows(self, tokens, argmax, aux, paths, path_lengths, committed_len):
        """N > 1: DeviceAccept, packed, and the accepted nodes' aux rows [B, D+1, 3Ht]; with the kernel also
        the commit by path (``commits``)."""
        b, n = tokens.shape
        if self.accept_kernel is not None:
            result, flat = self.accept_kernel(tokens, argmax, paths, path_lengths, committed_len, self.cache_shape,
                                              *self.caches)
        else:
            accepted, emitted, node_ids = self.accept(tokens, argmax, paths, path_lengths)
            flat = (ops.arange(b, dtype=ms.int32).reshape(b, 1) * n + node_ids).reshape(-1)
            result = pack_result(accepted, emitted, node_ids)
        return result, ops.gather(aux.reshape(b * n, -1), flat, 0).reshape(b, self.max_depth + 1, -1)


class DecodeStep(FixedSignatureCall, TeacherStep):
    """A teacher-only step's graph (the root alone): the one-token decode at slot and position L.

    construct(tokens [B,1] i32, committed_len [B] i32)
      -> (result [B,2D+3] i32, accepted_aux [B,D+1,3Ht]) (+ the chosen token [B,1] i32 if ``reference``):
    A = 0, node ids [0], the bonus is the teacher's argmax (or keyed sample at position L + 1) after the
    root; accepted_aux repeats the root's aux row. The same outputs as ``VerifyStep`` of the root-only
    tree, from two inputs instead of seven: position, cache slot and mask all follow from L. On the CPU
    runtime every graph input costs time (docs/teacher_profile.md §"Graph inputs"), and this graph is
    the whole cost of a teacher-only token.
    """

    def construct(self, tokens, committed_len):
        b = tokens.shape[0]
        at = committed_len.reshape(b, 1)                                      # [B, 1] position == slot == L
        cols = ops.arange(self.window, dtype=ms.int32).reshape(1, 1, self.window)
        allowed = cols <= committed_len.reshape(b, 1, 1)                      # [B, 1, W] slots [0, L]
        rows = flat_rows(at, self.num_kv_heads, self.capacity)
        hidden, aux = self.teacher.hidden_states(tokens, at, rows, allowed)   # [B,1,H], [B,1,3Ht]
        chosen = self.choose(self.teacher.lm_logits(hidden), at + 1)          # [B, 1] int32
        zeros = ops.zeros((b, self.max_depth + 1), ms.int32)
        result = pack_result(zeros[:, 0], ops.concat((chosen, zeros[:, 1:]), 1), zeros)
        accepted_aux = ops.broadcast_to(aux, (b, self.max_depth + 1, aux.shape[-1]))
        if self.reference:
            return result, accepted_aux, chosen
        return result, accepted_aux
