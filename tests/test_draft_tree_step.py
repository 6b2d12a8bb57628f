"""The device draft tree (eagle_ms/models/draft_tree_step.py, tree_graph.py) against the host path.

Second implementation: eagle_ms/drafting.py ``build_tree`` + eagle_ms/tree.py ``chain_first`` / ``tensorize``
(the host reference), driven by
  * an oracle of given per-depth log-probs: the in-graph ranking core ``TreeGrowth`` alone on the full grid
    M x Dmax x k = {1, 4, 16, 32} x {1, 4, 12} x {1, 2, 4}, random and tied scores. It runs eagerly (the
    Cell's construct called directly: the same ops, op by op), so the grid costs no graph compiles;
  * the host ``Eagle3Drafter`` (observe + propose) over the same draft Cell, from the state before each
    device step (cache restored): the whole DraftTreeStep graph (extend, root pair, every expansion, rerank,
    tree tensors) on a covering subset of shapes (``CASES``: Dmax 1 / 4 / 12, k 1 / 2 / 4, M 4 / 8 / 16 / 32)
    with context_window, attention windows, min_path_prob, exact log-prob ties (duplicated lm_head rows),
    A = -1 .. Dmax from packed results and a fallback period; the K/V both extends commit are compared too.
Every device tree passes ``check_invariants``; one case also runs the reference-mode check on its cache.
Graph compiles dominate the time (one DraftTreeStep per case and window, ~10-25 s CPU each here).
"""
import dataclasses
import json

import numpy as np
import pytest

from mindspore import Tensor, nn

from eagle_ms.device_drafter import DeviceTree, DeviceTreeDrafter, HostTree, no_step_result
from eagle_ms.draft_tree_check import DraftTreeMismatch, check_device_tree, compare_trees, host_tree
from eagle_ms.draft_weights import check_draft_state, load_draft_state, random_draft_state
from eagle_ms.drafting import TreeParams, build_tree
from eagle_ms.eagle3_drafter import Eagle3Drafter, scratch_size
from eagle_ms.models.draft_tree_step import DraftTreeStep, result_width, token_columns
from eagle_ms.models.eagle3 import Eagle3Config, Eagle3Draft
from eagle_ms.models.tree_graph import TreeGrowth, stable_rank
from eagle_ms.models import cpu_kernels
from eagle_ms.models.tree_kernels import KernelTreeGrowth
from eagle_ms.tree import chain_first
from eagle_ms.tree_checks import check_invariants
from helpers_models import float16_matrices


def pack_result_numpy(rows, max_depth):
    """Local copy of eagle_ms/models/step_result.py's: (A, tokens [A+1], node_ids [A+1]) rows -> [B, 2D+3]."""
    out = np.zeros((len(rows), result_width(max_depth)), np.int32)
    for b, (a, tokens, node_ids) in enumerate(rows):
        out[b, 0] = a
        out[b, token_columns(max_depth)][:a + 1] = tokens
        out[b, max_depth + 2:][:a + 1] = node_ids
    return out


# ------------------------------------------------------------------------------ the ranking core alone

class OracleTree(nn.Cell):
    """TreeGrowth over given log-probs: depth t's expand call returns lp[t-1], ids[t-1] for its k rows."""

    def __init__(self, params, levels=None):
        super().__init__()
        self.growth = TreeGrowth(params.budget, params.max_depth, params.top_k, params.min_path_prob, levels)
        self.d = params.max_depth

    def construct(self, root_lp, root_ids, lp, ids, length, root):
        state = self.growth.start(root_lp, root_ids)
        for depth in range(1, self.d):
            state, _ = self.growth.grow(state, depth, lp[:, depth - 1], ids[:, depth - 1])
        return self.growth.finish(state, length, root)


def oracle_inputs(rng, k, d, vocab=50, tied=False):
    """Root top-k and per-depth [D-1, k rows, k] log-probs, each row sorted descending (as ops.topk)."""
    shape = (max(d - 1, 1), k, k)
    if tied:  # dyadic values: many exact ties across rows and depths, some log p = 0 (clamped already)
        root = np.log(rng.choice([1.0, 0.5, 0.25, 0.125], (1, k)))
        lp = np.log(rng.choice([1.0, 0.5, 0.25, 0.125, 0.0625], shape))
    else:
        root = -rng.exponential(1.0, (1, k))
        lp = -rng.exponential(1.0, shape)
    root, lp = -np.sort(-root, -1), -np.sort(-lp, -1)
    ids = rng.integers(0, vocab, shape)
    return root.astype(np.float32), rng.integers(0, vocab, (1, k)), lp.astype(np.float32), ids


def oracle_host_tree(root_lp, root_ids, lp, ids, params, length, root, levels=None):
    def expand(depth, parent_rows, tokens):
        return lp[depth - 1], ids[depth - 1]
    build = build_tree(root, root_lp[0], root_ids[0], expand, params)
    return host_tree(chain_first(build.tree), length, params.budget, levels or params.max_depth)


def device_output_tree(outputs, length, budget, max_depth) -> HostTree:
    return DeviceTree(*outputs, committed_len=length, budget=budget, max_depth=max_depth).to_host()


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("max_depth", [1, 4, 12])
@pytest.mark.parametrize("budget", [1, 4, 16, 32])
def test_ranking_core_equals_build_tree_on_the_full_grid(budget, max_depth, k):
    """Random and tied scores; run eagerly (construct called directly: the same ops, no compile)."""
    params = TreeParams(budget, max_depth, k)
    cell = OracleTree(params)
    rng = np.random.default_rng(budget * 100 + max_depth * 10 + k)
    for tied in (False, True):
        root_lp, root_ids, lp, ids = oracle_inputs(rng, k, max_depth, tied=tied)
        length, root = int(rng.integers(1, 500)), int(rng.integers(0, 50))
        out = cell.construct(Tensor(root_lp), Tensor(root_ids.astype(np.int32)), Tensor(lp[None]),
                             Tensor(ids[None].astype(np.int32)), Tensor(np.array([length], np.int32)),
                             Tensor(np.array([root], np.int32)))
        got = device_output_tree(out, length, budget, max_depth)
        check_invariants(got.tensors)
        compare_trees(got, oracle_host_tree(root_lp, root_ids, lp, ids, params, length, root))


@pytest.mark.parametrize("depth", [1, 3, 4])
def test_shallow_tree_in_deeper_tensors_equals_build_tree(depth):
    """speculative.shallow_depth: TreeGrowth grows ``TreeParams.shallow(depth)`` (budget k + (depth-1) k^2
    < M here) into tensors of D = 10 (``levels``); the host builds the shallow tree and tensorizes it at D."""
    full = TreeParams(24, 10, 2)
    params = full.shallow(depth)
    assert (params.max_depth, params.budget) == (depth, min(24, 2 + (depth - 1) * 4))
    rng = np.random.default_rng(depth)
    root_lp, root_ids, lp, ids = oracle_inputs(rng, 2, depth)
    out = OracleTree(params, levels=10).construct(
        Tensor(root_lp), Tensor(root_ids.astype(np.int32)), Tensor(lp[None]), Tensor(ids[None].astype(np.int32)),
        Tensor(np.array([40], np.int32)), Tensor(np.array([3], np.int32)))
    got = device_output_tree(out, 40, params.budget, 10)
    assert got.tensors.paths.shape[-1] == 11 and got.tensors.ancestors.shape[0] == 11
    check_invariants(got.tensors)
    compare_trees(got, oracle_host_tree(root_lp, root_ids, lp, ids, params, 40, 3, levels=10))
    assert got.tensors.depth.max() == depth and got.tensors.valid.sum() == params.budget + 1


def test_shallow_params_refuse_a_depth_outside_the_tree():
    for bad in (0, 10, 11, True, 2.0):
        with pytest.raises(ValueError, match="speculative.shallow_depth"):
            TreeParams(24, 10, 2).shallow(bad)


def test_ranking_core_depth_cut_equals_build_tree():
    """min_path_prob: the host breaks at the first depth whose best frontier score < log p; here the best
    depth-t path has p = 0.6^t, so with p = 0.3 exactly depths 1..3 exist (0.6^2 = 0.36 >= 0.3 > 0.216)."""
    params = TreeParams(16, 8, 2, min_path_prob=0.3)
    lp = np.broadcast_to(np.log([0.6, 0.3]).astype(np.float32), (7, 2, 2)).copy()
    ids = np.arange(28).reshape(7, 2, 2)
    root_lp, root_ids = lp[0, :1], np.array([[5, 6]])
    out = OracleTree(params).construct(Tensor(root_lp), Tensor(root_ids.astype(np.int32)), Tensor(lp[None]),
                                       Tensor(ids[None].astype(np.int32)), Tensor(np.array([9], np.int32)),
                                       Tensor(np.array([1], np.int32)))
    got = device_output_tree(out, 9, 16, 8)
    compare_trees(got, oracle_host_tree(root_lp, root_ids, lp, ids, params, 9, 1))
    assert got.tensors.depth.max() == 3


def test_stable_rank_ties_by_index():
    earlier = Tensor(np.tril(np.ones((5, 5), bool), -1)[None])
    scores = Tensor(np.array([[-1.0, -0.5, -1.0, 0.0, -0.5]], np.float32))
    valid = Tensor(np.array([[True, True, True, False, True]]))
    assert stable_rank(scores, valid, earlier).asnumpy().tolist() == [[2, 0, 3, 4, 1]]


# ------------------------------------------------------------------------------ the whole graph vs the host drafter

CFG = Eagle3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=64, draft_vocab_size=40, target_hidden_size=24, aux_layer_ids=(0, 1, 2))
C = 112  # committed capacity: room for A = 0..12 in one run
CHUNK = 8
TOP_K = 4  # the drafts' in-graph top-K (k <= 4 below)
AUX = 3 * CFG.target_hidden_size
CASES = {  # name: (TreeParams, context_window, attention windows); a covering subset of the grid
    "M16-D4-k2-windows": (TreeParams(16, 4, 2), None, (16,)),
    "M32-D12-k2-draft_window5": (TreeParams(32, 12, 2), 5, None),
    "M8-D1-k4": (TreeParams(8, 1, 4), None, None),  # no expansion; 4 candidates < M: padding
    "M4-D4-k1-min_path_prob": (TreeParams(4, 4, 1, min_path_prob=0.2), None, None),
}
# the CPU kernels' early-stop cases: M 6 of 30 candidates (random drafts: every tree stops early), M 16 of
# 14 candidates (the budget is never reached: every depth runs)
CASES_KERNELS_ONLY = {"M6-D8-k2": (TreeParams(6, 8, 2), None, None), "M16-D4-k2": (TreeParams(16, 4, 2), None, None)}
CAP = C + max(scratch_size(p, CHUNK) for p, _, _ in [*CASES.values(), *CASES_KERNELS_ONLY.values()])


def draft_state(tied: bool, half: bool = False):
    """The drafts' random state; ``tied``: lm_head rows in identical pairs; ``half``: every weight matrix
    rounded to float16 (values float16 holds exactly, as the shipped draft's)."""
    state = check_draft_state(random_draft_state(CFG, seed=5, std=0.35), CFG)
    if half:
        state = float16_matrices(state, CFG)
    if tied:  # lm_head rows in identical pairs: every log-prob ties exactly with its twin's
        head = state["lm_head.weight"].copy()
        head[1::2] = head[0::2]
        state = {**state, "lm_head.weight": head}
    return state


class Setup:
    """One draft Cell driven two ways from the same state: the device step, then (cache restored) the host
    path. Sharing the Cell keeps the compiled graphs few; the host path still starts from the state before
    the device step, so the device's extend is checked against the host's (tree and cache bytes)."""

    def __init__(self, kernels="composite", kernel_weight_dtype="float32"):
        self.embed = np.random.default_rng(6).standard_normal((CFG.vocab_size, CFG.hidden_size)).astype(np.float32)
        self.draft = Eagle3Draft(CFG, 1, CAP, TOP_K, kernels=kernels, kernel_weight_dtype=kernel_weight_dtype)
        self.half = kernel_weight_dtype == "float16"
        self.cache = self.draft.midlayer.self_attn.kv_cache
        self.state_params = [self.cache.k_cache, self.cache.v_cache] + [
            p for _, p in self.draft.root_pair.parameters_and_names()]
        self.devices = {}
        self.load(tied=False)

    def load(self, tied, half=None):
        """The state ``draft_state(tied, half)``; half None: rounded to float16 when the kernels read float16."""
        load_draft_state(self.draft, draft_state(tied, self.half if half is None else half), embed=self.embed)

    def drafters(self, case):
        params, window, windows = {**CASES, **CASES_KERNELS_ONLY}[case]
        host = Eagle3Drafter(self.draft, params, C, CHUNK, window, attention_windows=windows)
        if case not in self.devices:  # one DeviceTreeDrafter per case keeps its compiled graphs
            self.devices[case] = DeviceTreeDrafter(
                Eagle3Drafter(self.draft, params, C, CHUNK, window, expand_cell=host.expand_cell,
                              attention_windows=windows))
        return host, self.devices[case]

    def snapshot(self):
        return [p.asnumpy().copy() for p in self.state_params]

    def restore(self, saved):
        for param, value in zip(self.state_params, saved):
            param.set_data(Tensor(value))

    def pairs(self, start, stop):
        """K and V of committed pairs [start, stop): [2, Hkv, n, head_dim] (slots X + start ..)."""
        x = CAP - C
        full = [p.asnumpy().reshape(self.cache.num_kv_heads, CAP, -1) for p in (self.cache.k_cache, self.cache.v_cache)]
        return np.stack([f[:, x + start:x + stop] for f in full])


@pytest.fixture(scope="module")
def setup():
    return Setup()


@pytest.fixture(scope="module")
def kernel_setup():
    """The same draft with the fused CPU kernels: its tree step drafts every depth in the ``DraftTree`` kernel
    (and finishes with KernelTreeGrowth), the host path expands with ``DraftFront`` + ``DraftBack``."""
    return Setup(kernels="cpu")


def drive(setup, host, device, seed, events, prompt_len=13, check_reference=False, run_dir=None, shallow=None):
    """begin, then per event one device step and (from the state before it) the host path, compared:
    the trees, and the K/V the two extends committed. Events: A in -1..D (the previous verify accepted A
    drafts; -1 = no step yet) or ("fallback", n) (n tokens of teacher-only steps, observed through the host
    path, then A = -1). ``check_reference``: also the reference-mode check after each device step.
    ``shallow``: TreeParams of a shallow tree drafted on every other step (speculative.shallow_depth), in
    the same D-shaped tensors. Returns the host trees."""
    rng = np.random.default_rng(seed)
    d, params = device.params.max_depth, device.params
    prompt = rng.integers(0, CFG.vocab_size, prompt_len)
    aux = rng.standard_normal((prompt_len, AUX)).astype(np.float32)
    root = int(rng.integers(CFG.vocab_size))
    host.begin(prompt, aux, root)
    length, trees = host.length, []
    for event in events:
        rows = rng.standard_normal((1, d + 1, AUX)).astype(np.float32) * 3  # padding rows: finite, ignored
        a = event if isinstance(event, int) else -1
        if not isinstance(event, int):  # teacher-only steps: observed through the host path, then A = -1
            tokens = rng.integers(0, CFG.vocab_size, event[1])
            host.observe(np.concatenate([[root], tokens[:-1]]), rng.standard_normal((event[1], AUX)).astype(np.float32),
                         int(tokens[-1]))
            root, length = int(tokens[-1]), length + event[1]
        tokens = rng.integers(0, CFG.vocab_size, a + 1)  # A drafts + the bonus (the next root)
        result = no_step_result(d) if a < 0 else pack_result_numpy([(a, tokens, np.arange(a + 1))], d)
        before = setup.snapshot()
        tree_params = shallow if shallow is not None and len(trees) % 2 else None
        tree = device.step(Tensor(result), Tensor(rows), length, a, tree_params)
        got = tree.to_host()
        if check_reference:
            check_device_tree(device.drafter, tree, run_dir, tree_params)  # the reference-mode check, same cache
        device_pairs = setup.pairs(0, C)
        setup.restore(before)
        if a >= 0:
            host.observe(np.concatenate([[root], tokens[:-1]]), rows[0, :a + 1], int(tokens[-1]))
            root = int(tokens[-1])
        length += a + 1
        assert tree.committed_len == host.length == device.drafter.length == length
        np.testing.assert_allclose(device_pairs[:, :, :length], setup.pairs(0, length), rtol=0, atol=1e-6)
        assert np.array_equal(device_pairs[:, :, length:], setup.pairs(length, C)), "wrote past the committed pairs"
        assert all(getattr(got.tensors, f).dtype == np.int32 for f in INT_FIELDS)
        check_invariants(got.tensors)
        tree_params = params if tree_params is None else tree_params
        want = host_tree(host.propose(root, tree_params), length, tree_params.budget, d)
        compare_trees(got, want, run_dir)
        trees.append(want)
    return trees


INT_FIELDS = ("tokens", "parent", "depth", "ancestors", "position_ids", "cache_slots", "paths", "path_lengths")


def events_for(max_depth):
    """A = -1 (after begin), every A from Dmax down to 0, a fallback period, then A = -1 again."""
    return [-1] + list(range(max_depth, -1, -1)) + [("fallback", 3), 1, -1]


@pytest.mark.parametrize("case", sorted(CASES))
def test_device_tree_equals_host_path(setup, case):
    params, _, windows = CASES[case]
    host, device = setup.drafters(case)
    trees = drive(setup, host, device, seed=len(case), events=events_for(params.max_depth),
                  check_reference=windows is not None)
    if windows:
        assert sorted(w for w, _ in device.steps) == [16, C], "the steps did not cross the attention window 16"
    if params.min_path_prob:
        assert any(t.tensors.depth.max() < params.max_depth for t in trees), "min_path_prob never cut a tree"
        assert any(t.tensors.depth.max() > 1 for t in trees), "min_path_prob cut every tree at depth 1"
    for graph in device.steps.values():
        assert len(graph.compile_cache) == 1, "a new call recompiled the tree step"


def test_exact_log_prob_ties(setup):
    """Duplicated lm_head rows: every draft log-prob ties exactly with its twin's, so siblings, frontier
    candidates and rerank candidates tie; the device must break every tie as build_tree does."""
    case = "M16-D4-k2-windows"
    params = CASES[case][0]
    setup.load(tied=True)
    try:
        host, device = setup.drafters(case)
        trees = drive(setup, host, device, seed=77, events=events_for(params.max_depth))
    finally:
        setup.load(tied=False)
    assert sum(sibling_ties(t) for t in trees) > len(trees), "the ties did not reach the trees"


@pytest.mark.parametrize("case", ["M32-D12-k2-draft_window5", "M4-D4-k1-min_path_prob"])
def test_device_tree_with_the_cpu_kernels_equals_host_path(kernel_setup, case):
    """The whole draft graph with the fused CPU kernels (layers and tree bookkeeping) against the host
    path over the same draft Cell; exact log-prob ties included on the deep case."""
    params = CASES[case][0]
    host, device = kernel_setup.drafters(case)
    drive(kernel_setup, host, device, seed=len(case) + 1, events=events_for(params.max_depth))
    if params.max_depth == 12:
        kernel_setup.load(tied=True)
        try:
            trees = drive(kernel_setup, host, device, seed=78, events=events_for(params.max_depth))
        finally:
            kernel_setup.load(tied=False)
        assert sum(sibling_ties(t) for t in trees) > len(trees), "the ties did not reach the trees"
    assert all(isinstance(g.growth, KernelTreeGrowth) and g.tree_kernel is not None for g in device.steps.values())


@pytest.mark.parametrize("case, stops", [("M6-D8-k2", True), ("M16-D4-k2", False)])
def test_draft_tree_kernel_stops_early_as_the_host_path(kernel_setup, case, stops):
    """``DraftTree``'s exact early stop (draft_kernels.cc ``tree_can_stop``) against the host path's
    ``build_tree``: where the host stops before the last depth on every step (M 6) and where it never can
    (M 16 > the 14 candidates), the device tree equals the host path's at every step."""
    params = CASES_KERNELS_ONLY[case][0]
    host, device = kernel_setup.drafters(case)
    calls = []
    propose = host.propose

    def counted(root, tree_params=None):
        tree = propose(root, tree_params)
        calls.append(host.last.expand_calls)
        return tree

    host.propose = counted
    drive(kernel_setup, host, device, seed=91, events=events_for(params.max_depth))
    assert calls and all((c < params.max_depth - 1) == stops for c in calls), calls
    # the kernel itself stops: from the last state, its tables with budget M against budget C + 1 (no stop)
    graph, k = next(iter(device.steps.values())), params.top_k
    c = k + (params.max_depth - 1) * k * k
    early, full = (_draft_tree_tables(kernel_setup.draft, graph, host.length, budget) for budget in (params.budget, c + 1))
    grown = int(early[1][0, 2].sum())                      # valid candidates = k + (depths run) * k^2
    assert grown == k + host.last.expand_calls * k * k and (grown < c) == stops
    np.testing.assert_array_equal(early[0][:, :grown], full[0][:, :grown])
    np.testing.assert_array_equal(early[1][:, :, :grown], full[1][:, :, :grown])
    assert not early[1][0, 2, grown:].any() and (early[1][0, 1, grown:] == -1).all()  # empty: never kept


def _draft_tree_tables(draft, graph, length, budget):
    """The ``DraftTree`` kernel's candidate tables (scores [1, C], ints [1, 3, C]) from the draft's stored root
    pair at committed length ``length``, as ``graph`` (a DraftTreeStep) calls it, with the budget ``budget``."""
    scratch, window, _ = graph.tree_settings.asnumpy().tolist()
    pair, cache = draft.root_pair, draft.midlayer.self_attn.kv_cache
    out = cpu_kernels.draft_tree_op()(
        pair.logprob, pair.target_ids, pair.hidden, Tensor(np.array([length], np.int32)), draft.rotary.inv_freq,
        cache.k_cache, cache.v_cache, Tensor(np.array([scratch, window, budget], np.int32)), graph.growth.cut,
        graph.growth.start_layout, *draft.kernel_weights())
    return [x.asnumpy() for x in out]


def test_float16_weight_copies_draft_the_float32_kernels_trees(kernel_setup):
    """``DraftTree`` and the host path's expand kernels reading float16 copies of matrices float16 holds
    exactly (``kernel_weight_dtype``, as for the shipped draft): the device tree equals the host path's at every
    step, and the trees are the float32 kernels' on the same weights, every field and score bit for bit."""
    case = "M32-D12-k2-draft_window5"
    events = events_for(CASES[case][0].max_depth)
    half = Setup(kernels="cpu", kernel_weight_dtype="float16")
    half_trees = drive(half, *half.drafters(case), seed=91, events=events)
    kernel_setup.load(tied=False, half=True)
    try:
        full_trees = drive(kernel_setup, *kernel_setup.drafters(case), seed=91, events=events)
    finally:
        kernel_setup.load(tied=False)
    assert len(half_trees) == len(full_trees) == len(events)
    for got, want in zip(half_trees, full_trees):
        np.testing.assert_array_equal(got.scores, want.scores)
        for field in dataclasses.fields(want.tensors):
            np.testing.assert_array_equal(getattr(got.tensors, field.name), getattr(want.tensors, field.name))


@pytest.mark.parametrize("kernels", ["composite", "cpu"])
def test_shallow_trees_alternating_with_full_trees_equal_host_path(setup, kernel_setup, kernels):
    """speculative.shallow_depth on the device: full (M 32, Dmax 12) and shallow (Dmax 3: 2 + 2*4 = 10
    nodes) trees on alternate steps of one drafter, each from the other's packed result, against the host
    path's trees of the same params; the reference-mode check too. Each tree shape compiles once."""
    box = setup if kernels == "composite" else kernel_setup
    case = "M32-D12-k2-draft_window5"
    params = CASES[case][0]
    shallow = params.shallow(3)
    host, device = box.drafters(case)
    trees = drive(box, host, device, seed=91, events=events_for(params.max_depth), check_reference=True,
                  shallow=shallow)
    assert {int(t.tensors.depth.max()) <= 3 for t in trees[1::2]} == {True}
    assert max(int(t.tensors.depth.max()) for t in trees[0::2]) > 3, "no full tree grew past the shallow depth"
    graphs = {p: g for (_, p), g in device.steps.items()}
    assert set(graphs) == {params, shallow}
    assert all(len(g.compile_cache) == 1 for g in graphs.values()), "a new call recompiled a tree step"


def sibling_ties(tree: HostTree) -> int:
    """Pairs of sibling nodes with exactly equal scores."""
    t = tree.tensors
    nodes = np.flatnonzero(t.valid)[1:]
    return sum(len(s) - len(set(s)) for s in
               ([tree.scores[n] for n in nodes if t.parent[n] == p] for p in range(t.num_nodes)))


def test_every_extend_keeps_the_root_pair_on_the_device(setup):
    """Eagle3Drafter.begin / observe store the last pair's output in Eagle3Draft.root_pair (device), equal to
    the copy the host path keeps."""
    host, _ = setup.drafters("M8-D1-k4")
    rng = np.random.default_rng(3)
    host.begin(rng.integers(0, 64, 11), rng.standard_normal((11, AUX)).astype(np.float32), 9)
    for step in range(2):
        store = setup.draft.root_pair
        assert int(store.token.asnumpy()[0]) == host.root_token
        np.testing.assert_array_equal(store.logprob.asnumpy()[0], host._root.logprob)
        np.testing.assert_array_equal(store.target_ids.asnumpy()[0], host._root.target_ids)
        np.testing.assert_array_equal(store.hidden.asnumpy()[0], host._root.hidden)
        host.observe(np.array([host.root_token, 4]), rng.standard_normal((2, AUX)).astype(np.float32), 20 + step)


def test_mismatch_names_the_first_differing_field_and_dumps(setup, tmp_path):
    host, device = setup.drafters("M8-D1-k4")
    rng = np.random.default_rng(4)
    host.begin(rng.integers(0, 64, 5), rng.standard_normal((5, AUX)).astype(np.float32), 2)
    device.drafter.follow_device(host.length)
    tree = device.step(no_step_result(1), np.zeros((1, 2, AUX), np.float32), host.length, -1)
    got = check_device_tree(device.drafter, tree, str(tmp_path))  # equal: no error, no dump
    assert not (tmp_path / "failures").exists()
    parent = got.tensors.parent.copy()
    parent[2] = 1  # a valid node re-parented
    bad = HostTree(dataclasses.replace(got.tensors, parent=parent), got.scores)
    with pytest.raises(DraftTreeMismatch, match=r"field 'parent' differs at \[2\]: device 1 host 0") as err:
        compare_trees(bad, got, str(tmp_path))
    dump = json.loads(open(err.value.dump_path).read())
    assert dump["field"] == "parent" and dump["device"]["parent"][2] == 1 and dump["host"]["parent"][2] == 0
    with pytest.raises(DraftTreeMismatch, match="field 'scores' differs by more than 1e-05 at \\[1\\]"):
        compare_trees(HostTree(got.tensors, got.scores + np.eye(got.scores.size)[1] * 2e-5), got)
    compare_trees(HostTree(got.tensors, got.scores + 5e-6), got)  # within float32 rounding of the sums


def test_follow_device_hands_back_to_the_host(setup):
    host, device = setup.drafters("M8-D1-k4")
    host.follow_device(7)
    assert host.length == 7 and host.root_token is None
    with pytest.raises(RuntimeError, match="begin/observe missing"):
        host.propose(3)
    with pytest.raises(ValueError, match="device draft length 0"):
        host.follow_device(0)


def test_bad_input_names_the_value(setup):
    host, device = setup.drafters("M8-D1-k4")
    with pytest.raises(ValueError, match="accepted=2: must be in \\[-1, max_depth 1\\]"):
        device.step(no_step_result(1), np.zeros((1, 2, AUX)), 5, 2)
    with pytest.raises(ValueError, match=f"= {C + 1} pairs must be in \\[1, capacity {C}\\]"):
        device.step(no_step_result(1), np.zeros((1, 2, AUX)), C - 1, 1)
    with pytest.raises(ValueError, match="committed_len=0"):
        device.step(no_step_result(1), np.zeros((1, 2, AUX)), 0, -1)
    params = TreeParams(8, 4, 2)
    with pytest.raises(ValueError, match="attention window 0"):
        DraftTreeStep(setup.draft, params, None, C, 0)
    with pytest.raises(ValueError, match="scratch slots"):
        DraftTreeStep(setup.draft, TreeParams(8, 30, 2), None, C, C)
    with pytest.raises(ValueError, match="speculative.top_k"):
        DraftTreeStep(setup.draft, TreeParams(8, 4, TOP_K + 1), None, C, C)
    with pytest.raises(ValueError, match="speculative.draft_window"):
        DraftTreeStep(setup.draft, params, 0, C, C)
