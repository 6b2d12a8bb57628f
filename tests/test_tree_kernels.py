"""The draft tree's CPU kernels (eagle_ms/models/tree_kernels.{cc,py}) against two second implementations.

* eagle_ms/drafting.py ``build_tree`` + eagle_ms/tree.py ``chain_first`` / ``tensorize`` (the host
  reference, float64 scores) on the full grid M x Dmax x k = {1, 4, 16, 32} x {1, 4, 12} x {1, 2, 4},
  random and tied log-probs, with tests/test_draft_tree_step.py's oracle inputs;
* the composite ``TreeGrowth`` (eagle_ms/models/tree_graph.py) on the same inputs: every output equal
  bit for bit (both sum scores in float32 in the same order).
The kernels run eagerly (the Cell's construct called directly), so the grid costs no graph compile; the
whole draft graph with the kernels is checked against the host path in tests/test_draft_tree_step.py
and, end to end, by every lossless and reference-mode test (runtime.kernels auto picks them on the CPU).
"""
import numpy as np
import pytest

from mindspore import Parameter, Tensor, nn

from eagle_ms.drafting import TreeParams
from eagle_ms.models import cpu_kernels
from eagle_ms.models.tree_graph import TreeGrowth
from eagle_ms.models.tree_kernels import KernelTreeGrowth
from eagle_ms.tree_checks import check_invariants
from test_draft_tree_step import device_output_tree, oracle_host_tree, oracle_inputs
from eagle_ms.draft_tree_check import compare_trees


class Oracle(nn.Cell):
    """A growth (composite or kernels) over given log-probs: depth t's expand returns lp[t-1], ids[t-1]."""

    def __init__(self, growth, max_depth):
        super().__init__()
        self.growth, self.d = growth, max_depth

    def construct(self, root_lp, root_ids, lp, ids, length, root):
        state = self.growth.start(root_lp, root_ids)
        for depth in range(1, self.d):
            state, _ = self.growth.grow(state, depth, lp[:, depth - 1], ids[:, depth - 1])
        return self.growth.finish(state, length, root)


def both(params, root_lp, root_ids, lp, ids, length, root):
    """(kernel outputs, composite outputs) as NumPy arrays."""
    inputs = (Tensor(root_lp), Tensor(root_ids.astype(np.int32)), Tensor(lp[None]), Tensor(ids[None].astype(np.int32)),
              Tensor(np.array([length], np.int32)), Tensor(np.array([root], np.int32)))
    grown = []
    for growth in (KernelTreeGrowth, TreeGrowth):
        cell = Oracle(growth(params.budget, params.max_depth, params.top_k, params.min_path_prob), params.max_depth)
        grown.append(cell.construct(*inputs))
    return grown


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("max_depth", [1, 4, 12])
@pytest.mark.parametrize("budget", [1, 4, 16, 32])
def test_kernels_equal_build_tree_and_the_composite_growth(budget, max_depth, k):
    params = TreeParams(budget, max_depth, k)
    rng = np.random.default_rng(budget * 100 + max_depth * 10 + k + 7)
    for tied in (False, True):
        root_lp, root_ids, lp, ids = oracle_inputs(rng, k, max_depth, tied=tied)
        length, root = int(rng.integers(1, 500)), int(rng.integers(0, 50))
        kernel, composite = both(params, root_lp, root_ids, lp, ids, length, root)
        got = device_output_tree(kernel, length, budget, max_depth)
        check_invariants(got.tensors)
        compare_trees(got, oracle_host_tree(root_lp, root_ids, lp, ids, params, length, root))
        for index, (a, b) in enumerate(zip(kernel, composite)):
            assert a.dtype == b.dtype and np.array_equal(a.asnumpy(), b.asnumpy()), f"output {index} differs"


def test_depth_cut_equals_build_tree():
    """min_path_prob 0.3 with best depth-t path 0.6^t: exactly depths 1..3 exist (as test_draft_tree_step)."""
    params = TreeParams(16, 8, 2, min_path_prob=0.3)
    lp = np.broadcast_to(np.log([0.6, 0.3]).astype(np.float32), (7, 2, 2)).copy()
    ids = np.arange(28).reshape(7, 2, 2)
    root_lp, root_ids = lp[0, :1], np.array([[5, 6]])
    kernel, composite = both(params, root_lp, root_ids, lp, ids, 9, 1)
    got = device_output_tree(kernel, 9, 16, 8)
    compare_trees(got, oracle_host_tree(root_lp, root_ids, lp, ids, params, 9, 1))
    assert got.tensors.depth.max() == 3
    assert all(np.array_equal(a.asnumpy(), b.asnumpy()) for a, b in zip(kernel, composite))


def test_grow_hand_computed_depth():
    """k = 2, one depth by hand: frontier scores [-0.5, -1], children log-probs [[-0.5, -2], [0.25, -1]]
    (0.25 clamps to 0) -> children scores [-1, -2.5, -1, -2]; the best two tie at -1: ids 2 then 4 (lower
    creation index first), parent rows 0 and 1."""
    start = cpu_kernels.tree_start_op()
    scores, ints, front_scores, front_ids, front_tokens = start(Tensor(np.array([[-0.5, -1.0]], np.float32)),
                                                               Tensor(np.array([[11, 12]], np.int32)),
                                                               Tensor(np.zeros((2, 6), np.int32)))
    assert front_tokens.asnumpy().tolist() == [[11, 12]] and front_ids.asnumpy().tolist() == [[0, 1]]
    out = cpu_kernels.tree_grow_op()(scores, ints, front_scores, front_ids,
                                     Tensor(np.array([[[-0.5, -2.0], [0.25, -1.0]]], np.float32)),
                                     Tensor(np.array([[[21, 22], [23, 24]]], np.int32)),
                                     Tensor(np.array([2], np.int32)), Tensor(np.array([-np.inf], np.float32)))
    scores, ints, front_scores, front_ids, front_tokens, parent_rows = (o.asnumpy() for o in out)
    assert scores.tolist() == [[-0.5, -1.0, -1.0, -2.5, -1.0, -2.0]]
    assert ints.tolist() == [[[11, 12, 21, 22, 23, 24], [-1, -1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1]]]
    assert front_ids.tolist() == [[2, 4]] and front_scores.tolist() == [[-1.0, -1.0]]
    assert front_tokens.tolist() == [[21, 23]] and parent_rows.tolist() == [[0, 1]]


def test_finish_rejects_a_table_whose_parent_follows_its_child():
    finish = cpu_kernels.tree_finish_op()
    scores = Tensor(np.array([[-0.5, -1.0]], np.float32))
    ints = Tensor(np.array([[[3, 4], [1, -1], [1, 1]]], np.int32))  # candidate 0's parent is candidate 1
    with pytest.raises(RuntimeError):
        finish(scores, ints, Tensor(np.array([7], np.int32)), Tensor(np.array([5], np.int32)),
               Tensor(np.zeros((3, 3), np.int32)))


def numpy_extend_inputs(result, committed_len, scratch, capacity, window, width, heads):
    """NumPy reference of the draft extend's rows (DraftTreeStep.extend's contract): ids, positions, the flat
    cache rows of their slots (order (b, row, head)), allowed, and (A, max(A + 1, 0), L + A + 1) per row."""
    b, rows = result.shape[0], (result.shape[1] - 1) // 2
    i = np.arange(rows)[None]
    start = committed_len[:, None]
    real = i <= result[:, :1]
    ids = np.where(real, result[:, 1:rows + 1], 0)
    positions = np.where(real, start + i, start)
    slots = np.minimum(np.where(real, scratch + start + i, i), capacity - 1)
    upto = np.where(real, start + i + 1, 0)[:, :, None]
    lo = np.maximum(upto - window, 0) if window else np.zeros_like(upto)
    pair = np.arange(width)[None, None] - scratch
    allowed = ((pair >= lo) & (pair < upto)) | (np.arange(width)[None, None] == slots[:, :, None])
    batch_heads = np.arange(b)[:, None, None] * heads + np.arange(heads)[None, None, :]
    flat = (batch_heads * capacity + slots[:, :, None]).reshape(-1)
    a = result[:, 0]
    return ids, positions, flat, allowed, a, np.maximum(a + 1, 0), committed_len + a + 1


@pytest.mark.parametrize("window", [0, 3])
def test_extend_inputs_equal_numpy(window):
    """A = -1 (no step yet), 0, D and in between, in one batch; unbounded and bounded context windows; a
    scratch slot clamped to the cache's last slot."""
    rng = np.random.default_rng(window)
    d, scratch, width = 4, 6, 6 + 20
    result = np.zeros((5, 2 * d + 3), np.int32)
    result[:, 0] = [-1, 0, 2, d, 1]
    result[:, 1:d + 2] = rng.integers(1, 50, (5, d + 1))
    committed_len = np.array([1, 5, 9, 14, 3], np.int32)
    capacity = scratch + 18  # row 3's last pair would be slot 6 + 14 + 4 = 24: clamped to 23
    settings = np.array([scratch, capacity, window], np.int32)
    heads = 2
    got = cpu_kernels.extend_inputs_op()(Tensor(result), Tensor(committed_len), Tensor(settings),
                                         Tensor(np.zeros(width, np.int32)), Tensor(np.zeros(heads, np.int32)))
    want = numpy_extend_inputs(result, committed_len, scratch, capacity, window, width, heads)
    for name, g, w in zip(("ids", "positions", "cache rows", "allowed", "A", "real rows", "L'"), got, want):
        np.testing.assert_array_equal(g.asnumpy(), w, err_msg=name)


def test_root_pair_takes_row_a_or_keeps_the_stored_pair():
    """B = 3 with A = 2, -1 (no step yet: the stored pair) and 0; NumPy indexing as the reference."""
    rng = np.random.default_rng(5)
    d, top, h = 3, 4, 6
    result = np.zeros((3, 2 * d + 3), np.int32)
    result[:, 0] = [2, -1, 0]
    result[:, 1:d + 2] = rng.integers(1, 90, (3, d + 1))
    logprob = rng.standard_normal((3, d + 1, top)).astype(np.float32)
    ids = rng.integers(0, 90, (3, d + 1, top)).astype(np.int32)
    hidden = rng.standard_normal((3, d + 1, h)).astype(np.float32)
    stored = (rng.integers(0, 90, 3).astype(np.int32), rng.standard_normal((3, top)).astype(np.float32),
              rng.integers(0, 90, (3, top)).astype(np.int32), rng.standard_normal((3, h)).astype(np.float32))
    params = [Parameter(Tensor(x.copy()), name=f"stored{i}") for i, x in enumerate(stored)]
    got = [x.asnumpy() for x in cpu_kernels.root_pair_op()(*[Tensor(x) for x in (result, logprob, ids, hidden)],
                                                              *params)]
    for b, a in enumerate(result[:, 0]):
        want = ((result[b, 1 + a], logprob[b, a], ids[b, a], hidden[b, a]) if a >= 0 else
                tuple(s[b] for s in stored))
        for g, w, p in zip(got, want, params):
            np.testing.assert_array_equal(g[b], w)
            np.testing.assert_array_equal(p.asnumpy()[b], w)  # the stored pair was overwritten in place
