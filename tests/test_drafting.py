"""EAGLE-2 dynamic tree (eagle_ms.drafting) and the EAGLE-3 drafter's cache handling (eagle_ms.eagle3_drafter).

Second implementations:
  * ``reference_eagle2``: a straightforward loop-and-sort EAGLE-2 (eagle_ms/drafting.py module doc) over a function
    path -> draft log-probs, no early stop. ``build_tree`` (fixed-shape frontier calls, early stop on
    and off) must produce the SAME tree from crafted log-probs full of ties (and exact log p = 0);
  * the NumPy fp64 draft forward of test_eagle3_model (``np_draft``), recomputing the draft over the whole
    sequence (committed pairs + the node's root path) for every tree node: the real drafter (extend in
    chunks, observe, expand in the scratch region) must give the same root distribution, hidden states
    and tree, with and without ``draft_window``; expansions never touch the committed region.
"""
import numpy as np
import pytest

from eagle_ms.draft_weights import check_draft_state, draft_to_target, load_draft_state, random_draft_state
from eagle_ms.drafting import TreeParams, build_tree, rank_order, select_tree
from eagle_ms.eagle3_drafter import Eagle3Drafter, scratch_size
from eagle_ms.models.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Expand
from eagle_ms.tree import chain_first
from test_eagle3_model import np_draft, rel_err

# ------------------------------------------------------------------------------ reference EAGLE-2


def reference_eagle2(oracle, k, budget, max_depth):
    """Plain EAGLE-2: returns (tokens, parents as node ids, scores) of the kept tree, creation order.

    oracle(path tuple) -> log-probs [V] of the next token after root + path. Ranking: score desc,
    then creation order; a row's top-k: log p desc, then token id.
    """
    nodes = []  # dicts: path, score, parent (creation index or None), idx

    def children(node):
        path = () if node is None else node["path"]
        lp = oracle(path)
        best = sorted(range(len(lp)), key=lambda t: (-lp[t], t))[:k]
        out = []
        for t in best:
            score = (0.0 if node is None else node["score"]) + min(float(lp[t]), 0.0)
            out.append({"path": path + (t,), "score": score, "parent": None if node is None else node["idx"],
                        "idx": len(nodes) + len(out)})
        return out

    def key(n):
        return (-n["score"], n["idx"])

    layer = children(None)
    nodes += layer
    frontier = sorted(layer, key=key)[:k]
    for _ in range(2, max_depth + 1):
        new = []
        for f in frontier:
            for c in children(f):
                c["idx"] = len(nodes) + len(new)
                new.append(c)
        nodes += new
        frontier = sorted(new, key=key)[:k]
    keep = sorted(sorted(nodes, key=key)[:budget], key=lambda n: n["idx"])
    node_id = {n["idx"]: i + 1 for i, n in enumerate(keep)}
    parents = [0 if n["parent"] is None else node_id[n["parent"]] for n in keep]
    return [n["path"][-1] for n in keep], parents, [n["score"] for n in keep]


class PathDraft:
    """An ExpandFn over oracle(path): tracks each frontier row's path as the drafter tracks hidden states."""

    def __init__(self, oracle, k):
        self.oracle, self.k, self.prev, self.calls = oracle, k, None, []

    def top(self, path):
        lp = np.asarray(self.oracle(path), np.float64)
        order = np.argsort(-lp, kind="stable")[:self.k]
        return lp[order], order

    def root(self):
        return self.top(())

    def __call__(self, depth, parent_rows, tokens):
        paths = [(int(t),) for t in tokens] if depth == 1 else \
            [self.prev[r] + (int(t),) for r, t in zip(parent_rows, tokens)]
        self.prev = paths
        self.calls.append(paths)
        rows = [self.top(p) for p in paths]
        return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


def crafted_oracle(seed, vocab=6):
    """Log-probs with many exact ties: dyadic probabilities permuted per path; some rows certain (log p = 0)."""
    base = np.log2(np.array([0.5, 0.125, 0.125, 0.125, 0.0625, 0.0625])[:vocab])

    def oracle(path):
        rng = np.random.default_rng([seed, len(path)] + list(path))
        if rng.random() < 0.15:
            lp = np.full(vocab, -60.0)
            lp[rng.integers(vocab)] = 0.0
            return lp
        return rng.permutation(base) * np.log(2.0)
    return oracle


def run_build(oracle, k, budget, depth, early_stop):
    fake = PathDraft(oracle, k)
    lp, ids = fake.root()
    return build_tree(99, lp, ids, fake, TreeParams(budget, depth, k), early_stop), fake


def check_tree_shape(tree, depth_bound):
    parents = tree.parents
    assert np.all(parents < np.arange(1, tree.num_nodes + 1)) and np.all(parents >= 0)
    depth = np.zeros(tree.num_nodes + 1, int)
    scores = np.concatenate([[0.0], tree.scores])
    for i, p in enumerate(parents, start=1):
        depth[i] = depth[p] + 1
        assert scores[i] <= scores[p], "a child outranks its parent"
    assert depth.max() <= depth_bound


# ------------------------------------------------------------------------------ build_tree vs reference

@pytest.mark.parametrize("k, budget, depth", [(1, 1, 1), (1, 4, 4), (2, 3, 2), (2, 8, 5), (3, 10, 4),
                                              (4, 16, 10), (4, 4, 10), (3, 40, 3), (5, 200, 3)])
def test_crafted_logits_same_tree_as_reference(k, budget, depth):
    for seed in range(12):
        oracle = crafted_oracle(seed)
        want = reference_eagle2(oracle, k, budget, depth)
        for early in (False, True):
            got, fake = run_build(oracle, k, budget, depth, early)
            assert got.tree.tokens.tolist() == want[0], (seed, early)
            assert got.tree.parents.tolist() == want[1], (seed, early)
            assert got.tree.scores.tolist() == want[2], (seed, early)
            check_tree_shape(got.tree, depth)
            assert all(len(p) == k for p in fake.calls), "expand calls are not k rows"
            if not early:
                assert got.expand_calls == depth - 1


def test_random_logits_same_tree_as_reference():
    for seed in range(20):
        rng = np.random.default_rng(seed)
        k, budget, depth, vocab = int(rng.integers(1, 5)), int(rng.integers(1, 30)), int(rng.integers(1, 7)), 9

        def oracle(path, seed=seed):
            r = np.random.default_rng([seed + 100] + list(path))
            x = r.standard_normal(vocab) * 2
            return x - np.log(np.exp(x).sum())
        want = reference_eagle2(oracle, k, budget, depth)
        got, _ = run_build(oracle, k, budget, depth, True)
        assert (got.tree.tokens.tolist(), got.tree.parents.tolist()) == (want[0], want[1]), seed
        np.testing.assert_allclose(got.tree.scores, want[2], rtol=0, atol=0)


def test_early_stop_is_exact_and_saves_calls():
    def peaked(path):  # one near-certain token per row: the budget fills with a chain early
        lp = np.full(6, -12.0)
        lp[(len(path) * 7 + 1) % 6] = -1e-4
        return lp
    for budget in (1, 2, 5):
        full, _ = run_build(peaked, 3, budget, 10, False)
        early, _ = run_build(peaked, 3, budget, 10, True)
        assert early.tree.tokens.tolist() == full.tree.tokens.tolist()
        assert early.tree.parents.tolist() == full.tree.parents.tolist()
        assert early.expand_calls == budget - 1 < full.expand_calls == 9


def test_depth_cut_stops_where_every_frontier_path_is_unlikely():
    """Top token p = 0.7 at every node: the best depth-t path has p = 0.7^t; with min_path_prob 0.3 the
    depth-4 frontier (0.24) is below the cut, so exactly 3 expansions run and the tree is the EAGLE-2
    tree of max_depth 4 (hand-derived: 0.7^3 = 0.343 >= 0.3 > 0.7^4)."""
    def decaying(path):
        lp = np.log(np.array([0.7, 0.2, 0.06, 0.04]))
        return np.roll(lp, len(path) % 4)
    want = reference_eagle2(decaying, 2, 16, 4)
    for early in (False, True):
        fake = PathDraft(decaying, 2)
        lp, ids = fake.root()
        got = build_tree(99, lp, ids, fake, TreeParams(16, 10, 2, min_path_prob=0.3), early)
        assert got.expand_calls == 3
        assert (got.tree.tokens.tolist(), got.tree.parents.tolist()) == (want[0], want[1])
    uncut = build_tree(99, lp, ids, PathDraft(decaying, 2), TreeParams(16, 10, 2), False)
    assert uncut.expand_calls == 9


@pytest.mark.parametrize("value", [-0.1, 1.0, True, "0.2"])
def test_min_path_prob_validation(value):
    with pytest.raises(ValueError, match="speculative.min_path_prob"):
        TreeParams(4, 3, 2, min_path_prob=value)


def test_budget_one_never_expands():
    got, fake = run_build(crafted_oracle(3), 4, 1, 10, True)
    assert got.expand_calls == 0 and fake.calls == [] and got.tree.num_nodes == 1


def test_ties_never_disconnect_the_tree():
    """All log p = 0: every candidate ties; creation order keeps parents first."""
    got, _ = run_build(lambda path: np.zeros(5), 2, 7, 4, True)
    check_tree_shape(got.tree, 4)
    assert got.tree.parents.tolist() == [0, 0, 1, 1, 2, 2, 3]


def test_select_tree_and_rank_order():
    assert rank_order(np.array([-1.0, -0.5, -1.0])).tolist() == [1, 0, 2]
    # the module-doc worked example
    tree = select_tree(5, np.array([7, 9, 3, 5, 3, 8]), np.array([-1, -1, 0, 0, 1, 1]),
                       np.array([-0.1, -2.0, -0.3, -1.6, -2.1, -2.5]), 3)
    assert tree.tokens.tolist() == [7, 3, 5] and tree.parents.tolist() == [0, 1, 1]


@pytest.mark.parametrize("kwargs, key", [({"budget": 0}, "budget"), ({"max_depth": 0}, "max_depth"),
                                         ({"top_k": 0}, "top_k"), ({"budget": 2.0}, "budget"),
                                         ({"top_k": True}, "top_k")])
def test_tree_params_validation(kwargs, key):
    args = {"budget": 4, "max_depth": 3, "top_k": 2, **kwargs}
    with pytest.raises(ValueError, match=f"speculative.{key}"):
        TreeParams(**args)


def test_check_fits_names_the_key():
    p = TreeParams(16, 10, 4)
    p.check_fits(40, 64, 36)
    with pytest.raises(ValueError, match="speculative.top_k"):
        TreeParams(4, 3, 41).check_fits(40, 64)
    with pytest.raises(ValueError, match="speculative.budget"):
        p.check_fits(40, 16)
    with pytest.raises(ValueError, match="speculative.max_depth"):
        TreeParams(4, 20, 1).check_fits(40, 16)
    with pytest.raises(ValueError, match="speculative.max_depth.*scratch"):
        p.check_fits(40, 64, 35)


# ------------------------------------------------------------------------------ the real drafter

CFG = Eagle3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=64, draft_vocab_size=40, target_hidden_size=24, aux_layer_ids=(0, 1, 2))
C = 48  # committed capacity (the teacher's)
CHUNK = 8
K = 3
PARAMS = [TreeParams(8, 4, K), TreeParams(12, 6, K), TreeParams(1, 4, K), TreeParams(10, 4, K - 1)]
CAP = C + max(scratch_size(p, CHUNK) for p in PARAMS)


class Setup:
    def __init__(self):
        self.state = check_draft_state(random_draft_state(CFG, seed=5, std=0.35), CFG)
        self.embed = np.random.default_rng(6).standard_normal((CFG.vocab_size, CFG.hidden_size)).astype(np.float32)
        self.draft = Eagle3Draft(CFG, 1, CAP, K)
        load_draft_state(self.draft, self.state, embed=self.embed)
        self.expand = Eagle3Expand(self.draft)
        self.targets = draft_to_target(self.state["d2t"])

    def drafter(self, params, window=None, early_stop=True, windows=None):
        return Eagle3Drafter(self.draft, params, C, CHUNK, window, early_stop, expand_cell=self.expand,
                             attention_windows=windows)

    def cache(self):
        c = self.draft.midlayer.self_attn.kv_cache
        return [p.asnumpy().reshape(c.num_kv_heads, c.capacity, c.head_dim).copy() for p in (c.k_cache, c.v_cache)]


@pytest.fixture(scope="module")
def setup():
    return Setup()


class Recompute:
    """Whole-sequence fp64 recompute of the draft: committed pairs, then a node's root path."""

    def __init__(self, setup, pair_tokens, pair_feats, window):
        self.s, self.tokens, self.feats, self.window = setup, list(pair_tokens), list(pair_feats), window
        self.L = len(self.tokens)
        self.memo = {}

    def _allowed(self, n_path):
        L, W = self.L, self.window
        n = L + n_path
        allowed = np.zeros((n, n), bool)
        for j in range(L):
            lo = 0 if W is None else max(0, j + 1 - W)
            allowed[j, lo:j + 1] = True
        lo = 0 if W is None else max(0, L - W)
        for i in range(n_path):
            allowed[L + i, lo:L] = True
            allowed[L + i, L:L + i + 1] = True
        return allowed

    def run(self, path):
        """(target log-probs [V] after the path, hidden [H] of its last row) for path = node tokens."""
        if path in self.memo:
            return self.memo[path]
        feats, flags = list(self.feats), [True] * self.L
        for i in range(len(path)):
            feats.append(self.run(path[:i])[1])
            flags.append(False)
        toks = np.array(self.tokens + list(path))
        pos = np.concatenate([np.arange(self.L), self.L + np.arange(len(path))])
        lp, h = np_draft(CFG, self.s.state, self.s.embed, toks, feats, flags, pos, self._allowed(len(path)))
        full = np.full(CFG.vocab_size, -np.inf)
        full[self.s.targets] = lp[-1]
        self.memo[path] = (full, h[-1])
        return self.memo[path]

    def oracle(self, path):
        return self.run(tuple(path))[0]


def drive(setup, drafter, seed, observes=((2,), (0,), (3,))):
    """begin with a 13-token prompt, then observe synthetic accepts; returns pair tokens/features and root."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, CFG.vocab_size, 13)
    aux = rng.standard_normal((13, 3 * CFG.target_hidden_size)).astype(np.float32)
    root = int(rng.integers(CFG.vocab_size))
    drafter.begin(prompt, aux, root)
    pair_tokens, pair_feats = list(prompt[1:]) + [root], list(aux)
    for (a,) in observes:
        committed = np.concatenate([[root], rng.integers(0, CFG.vocab_size, a)])
        new_aux = rng.standard_normal((a + 1, 3 * CFG.target_hidden_size)).astype(np.float32)
        root = int(rng.integers(CFG.vocab_size))
        drafter.observe(committed, new_aux, root)
        pair_tokens += list(committed[1:]) + [root]
        pair_feats += list(new_aux)
    assert drafter.length == len(pair_tokens)
    return pair_tokens, pair_feats, root


def spy_expand(drafter):
    records = []
    inner = drafter._expand

    def spy(depth, parent_rows, tokens):
        lp, ids = inner(depth, parent_rows, tokens)
        records.append((depth, np.array(parent_rows), np.array(tokens), lp, ids, drafter._prev.hidden.copy()))
        return lp, ids
    drafter._expand = spy
    return records


@pytest.mark.parametrize("pi, window, windows", [(0, None, None), (1, None, None), (2, None, None),
                                                 (3, None, None), (0, 5, None), (1, 5, None),
                                                 (1, None, (16, 32))],
                         ids=["p0", "p1", "p2-budget1", "p3-k2-of-K3", "p0-draft_window5", "p1-draft_window5",
                              "p1-attention_windows"])
def test_drafter_equals_whole_sequence_recompute(setup, pi, window, windows):
    params = PARAMS[pi]
    drafter = setup.drafter(params, window, windows=windows)
    pair_tokens, pair_feats, root = drive(setup, drafter, seed=20 + pi)
    if windows:
        assert drafter._mask_width(drafter.length) == drafter.scratch + 32 < CAP  # a narrow window really ran
    ref = Recompute(setup, pair_tokens, pair_feats, window)
    # the root pair's output (after chunked begin + observes) == recompute over all committed pairs
    full, hid = ref.run(())
    lp, ids, hidden = drafter._root.logprob, drafter._root.target_ids, drafter._root.hidden
    assert rel_err(hidden, hid) < 1e-4
    assert rel_err(lp, full[ids]) < 1e-4
    np.testing.assert_array_equal(ids, np.argsort(-full, kind="stable")[:K])
    records = spy_expand(drafter)
    proposed = drafter.propose(root)
    tree = drafter.last.tree  # creation order; propose returns it renumbered chain-first
    chained = chain_first(tree)
    assert (proposed.tokens.tolist(), proposed.parents.tolist()) == (chained.tokens.tolist(), chained.parents.tolist())
    # every expand row's hidden == the recompute of its root path
    paths = None
    for depth, parents, tokens, _, _, hidden in records:
        paths = [(int(t),) for t in tokens] if depth == 1 else [paths[r] + (int(t),) for r, t in zip(parents, tokens)]
        for row, path in enumerate(paths):
            assert rel_err(hidden[row], ref.run(path)[1]) < 1e-4, (depth, row)
    # and the tree == plain EAGLE-2 on the recomputed log-probs
    want = reference_eagle2(ref.oracle, params.top_k, params.budget, params.max_depth)
    assert tree.tokens.tolist() == [int(t) for t in want[0]]
    assert tree.parents.tolist() == want[1]
    np.testing.assert_allclose(tree.scores, want[2], rtol=1e-4, atol=1e-4)
    assert set(tree.tokens.tolist()) <= set(setup.targets.tolist())


def test_observe_of_several_steps_at_once_equals_recompute(setup):
    """After teacher-only fallback steps the loop observes many tokens in one call (here 2 * (Dmax+1) + 3,
    split into 3 extend calls): the root pair's output still equals the whole-sequence recompute."""
    params = PARAMS[0]
    drafter = setup.drafter(params)
    long = 2 * (params.max_depth + 1) + 2  # A: the call carries A + 1 tokens
    pair_tokens, pair_feats, root = drive(setup, drafter, seed=61, observes=((2,), (long,), (1,)))
    full, hid = Recompute(setup, pair_tokens, pair_feats, None).run(())
    lp, ids, hidden = drafter._root.logprob, drafter._root.target_ids, drafter._root.hidden
    assert rel_err(hidden, hid) < 1e-4
    assert rel_err(lp, full[ids]) < 1e-4
    np.testing.assert_array_equal(ids, np.argsort(-full, kind="stable")[:K])


def test_window_changes_the_draft(setup):
    a, b = setup.drafter(PARAMS[0]), setup.drafter(PARAMS[0], window=2)
    drive(setup, a, seed=40)
    drive(setup, b, seed=40)
    assert not np.allclose(a._root.hidden, b._root.hidden)


def test_scratch_never_leaks_into_the_committed_region(setup):
    drafter = setup.drafter(PARAMS[1], early_stop=False)
    x = drafter.scratch  # committed pair j lives at slot x + j; scratch is [0, x)
    _, _, root = drive(setup, drafter, seed=41, observes=((1,),))
    before = setup.cache()
    drafter.propose(root)
    after = setup.cache()
    for b, a in zip(before, after):
        assert np.array_equal(b[:, x:].view(np.uint32), a[:, x:].view(np.uint32)), "an expansion wrote past scratch"
        assert not np.array_equal(b[:, :x], a[:, :x]), "expansions did not use the scratch region"
    # an observe with fewer than Dmax+1 pairs writes its padding rows to scratch, not past its pairs
    L = drafter.length
    drafter.observe(np.array([root, 5]), np.zeros((2, 3 * CFG.target_hidden_size), np.float32), 7)
    later = setup.cache()
    for a, c in zip(after, later):
        assert np.array_equal(a[:, x:x + L].view(np.uint32), c[:, x:x + L].view(np.uint32))
        assert np.array_equal(a[:, x + L + 2:].view(np.uint32), c[:, x + L + 2:].view(np.uint32))
        assert not np.array_equal(a[:, x + L:x + L + 2], c[:, x + L:x + L + 2])


def test_warm_up_compiles_every_graph(setup):
    """After warm_up, a generation's calls (every window, chunk, observe, expand) compile nothing new."""
    drafter = setup.drafter(PARAMS[1], windows=(16, 32), early_stop=False)
    drafter.warm_up()
    assert drafter.length == 0 and drafter._root is None
    counts = (len(setup.draft.compile_cache), len(setup.expand.compile_cache))
    for seed in (50, 51):
        _, _, root = drive(setup, drafter, seed=seed, observes=((2,), (6,), (0,)) * 3)
        drafter.propose(root)
    assert (len(setup.draft.compile_cache), len(setup.expand.compile_cache)) == counts


def test_drafter_validation(setup):
    with pytest.raises(ValueError, match="speculative.top_k"):
        Eagle3Drafter(setup.draft, TreeParams(4, 3, K + 1), C, CHUNK)
    with pytest.raises(ValueError, match="draft cache capacity|scratch"):
        Eagle3Drafter(setup.draft, TreeParams(4, 3, K), CAP - 2, CHUNK)
    with pytest.raises(ValueError, match="speculative.draft_window"):
        Eagle3Drafter(setup.draft, TreeParams(4, 3, K), C, CHUNK, context_window=0)
    with pytest.raises(ValueError, match="speculative.budget"):
        Eagle3Drafter(setup.draft, TreeParams(C, 3, K), C, CHUNK)
    drafter = setup.drafter(PARAMS[0])
    with pytest.raises(RuntimeError, match="begin"):
        drafter.propose(3)
    _, _, root = drive(setup, drafter, seed=42, observes=())
    with pytest.raises(RuntimeError, match="holds token"):
        drafter.propose(root + 1)
    with pytest.raises(ValueError, match="prompt_aux"):
        drafter.begin(np.arange(4), np.zeros((3, 72)), 1)
