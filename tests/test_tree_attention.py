"""Tree attention equivalence: one tree-masked verify == sequential decoding along every root path.

After a real (chunked) prefill, a hand-built tree (chain, star, binary, random; padded to one budget so
a single verify graph serves them all) is verified in one forward. Row k of its logits/aux must equal
  1. the last row of a fresh sequential one-token decode of node k's root-path tokens through the same
     cache (restored to the post-prefill snapshot between paths), and
  2. an independent NumPy float64 full-sequence forward of prompt + root-path tokens
     (tests/numpy_reference.py), and the same forward over prompt + the whole tree with the tree mask.
fp32 vs fp32 and fp32 vs fp64 agree to 1e-4 relative to the largest |reference| logit.
"""
import numpy as np
import pytest

from helpers_models import (TINY, binary_parents, build_teacher, chain_parents, leaves, make_runner,
                            make_tree, prompt, random_parents, rel_err, root_path, star_parents)
from numpy_reference import reference_forward

from eagle_ms.tree import tensorize
from eagle_ms.tree_checks import check_invariants

BUDGET = 16  # every tree below is padded to N = 17: one compiled verify graph
MAX_DEPTH = 10
CAPACITY = 64
TOL = 1e-4


def _random_tree_parents(seed, m=BUDGET, depth=6):
    return random_parents(m, np.random.default_rng(seed), depth)


TREES = {
    "chain6": chain_parents(6),            # depth 6, 10 padding nodes
    "chain10": chain_parents(10),          # depth == MAX_DEPTH
    "star16": star_parents(16),            # full budget, depth 1
    "binary10": binary_parents(10),        # depth 3
    "random16a": _random_tree_parents(1),
    "random16b": _random_tree_parents(2, depth=MAX_DEPTH),
    "random5": _random_tree_parents(3, m=5, depth=3),
    "root_only": [],
}


@pytest.fixture(scope="module")
def teacher():
    model, state = build_teacher(CAPACITY, seed=11)
    return model, state, make_runner(model, prefill_chunk=8, max_depth=MAX_DEPTH)


def _prefilled(runner, prompt_ids):
    """Prefill; return (root token, snapshot, L)."""
    out = runner.prefill(prompt_ids)
    return int(out.argmax[-1]), runner.snapshot(), runner.length


def _tree_tokens(parents, seed):
    return np.random.default_rng(seed).integers(0, TINY.vocab_size, size=len(parents))


def _sequential(runner, snapshot, length, tokens, parents):
    """{node: (logits [V], aux [3H])} by decoding each leaf's root path one token at a time."""
    rows = {}
    for leaf in leaves(parents):
        path = root_path(parents, leaf)
        runner.restore(snapshot, length)
        out = runner.decode_chain(tokens[path])
        for i, node in enumerate(path):
            rows[node] = (out.logits[i], out.aux[i])
    return rows


@pytest.mark.parametrize("prompt_len", [11, 1])
@pytest.mark.parametrize("name", sorted(TREES))
def test_verify_rows_equal_sequential_decode(teacher, name, prompt_len):
    model, state, runner = teacher
    parents = TREES[name]
    root, snapshot, length = _prefilled(runner, prompt(prompt_len, prompt_len))
    t = tensorize(make_tree(root, _tree_tokens(parents, len(name)), parents), length, BUDGET, MAX_DEPTH)
    check_invariants(t)
    verified = runner.verify(t)
    assert verified.logits.shape == (BUDGET + 1, TINY.vocab_size)
    assert runner.length == length  # a verify commits nothing
    sequential = _sequential(runner, snapshot, length, t.tokens, parents)
    assert sorted(sequential) == list(range(len(parents) + 1))  # every valid node was checked
    for node, (logits, aux) in sequential.items():
        err = rel_err(verified.logits[node], logits)
        assert err < TOL, f"{name}: node {node} logits differ from sequential decode (rel {err:.2e})"
        assert rel_err(verified.aux[node], aux) < TOL, f"{name}: node {node} aux differs"
        assert verified.argmax[node] == int(np.argmax(logits))


@pytest.mark.parametrize("name", ["chain10", "binary10", "random16a", "random16b", "star16"])
def test_verify_rows_equal_numpy_fp64_path_forward(teacher, name):
    """Row k == NumPy fp64 causal forward of prompt + root path of k (positions 0..P+depth)."""
    model, state, runner = teacher
    parents = TREES[name]
    prompt_ids = prompt(7, 13)
    root, _, length = _prefilled(runner, prompt_ids)
    t = tensorize(make_tree(root, _tree_tokens(parents, 99), parents), length, BUDGET, MAX_DEPTH)
    verified = runner.verify(t)
    checked = set()
    for leaf in leaves(parents):
        path = root_path(parents, leaf)
        ref = reference_forward(TINY, state, np.concatenate([prompt_ids, t.tokens[path]]))
        rows = ref.logits[length:]  # rows of the path tokens
        for i, node in enumerate(path):
            err = rel_err(verified.logits[node], rows[i])
            assert err < TOL, f"{name}: node {node} vs fp64 reference: rel {err:.2e}"
            assert rel_err(verified.aux[node], ref.aux[length + i]) < TOL
            checked.add(node)
    assert checked == set(range(len(parents) + 1))


@pytest.mark.parametrize("name", ["random16a", "binary10"])
def test_verify_equals_numpy_fp64_tree_masked_forward(teacher, name):
    """The whole tree as one fp64 sequence: prompt causal, node k sees the prompt + its ancestors,
    RoPE position P + depth(k): the library's verify rows equal it for every valid node."""
    model, state, runner = teacher
    parents = TREES[name]
    prompt_ids = prompt(8, 9)
    root, _, length = _prefilled(runner, prompt_ids)
    t = tensorize(make_tree(root, _tree_tokens(parents, 5), parents), length, BUDGET, MAX_DEPTH)
    verified = runner.verify(t)
    n = len(parents) + 1
    total = length + n
    allowed = np.tril(np.ones((total, total), bool))
    allowed[length:, length:] = False
    for k in range(n):
        for j in root_path(parents, k):  # independent of t.tree_mask: built from the parent list
            allowed[length + k, length + j] = True
    positions = np.concatenate([np.arange(length),
                                length + np.array([len(root_path(parents, k)) - 1 for k in range(n)])])
    ref = reference_forward(TINY, state, np.concatenate([prompt_ids, t.tokens[:n]]), positions, allowed)
    err = rel_err(verified.logits[:n], ref.logits[length:])
    assert err < TOL, f"{name}: verify vs fp64 tree-masked forward: rel {err:.2e}"


def test_tree_mask_matters(teacher):
    """Sanity of the comparison itself: siblings with the same token but different parents get
    different logits, and the same token at two depths differs (positions enter RoPE)."""
    model, state, runner = teacher
    root, _, length = _prefilled(runner, prompt(3, 10))
    # node 1, 2: children of root (tokens 5, 6); node 3 child of 1, node 4 child of 2, both token 9
    t = tensorize(make_tree(root, [5, 6, 9, 9], [0, 0, 1, 2]), length, BUDGET, MAX_DEPTH)
    out = runner.verify(t)
    assert rel_err(out.logits[3], out.logits[4]) > 1e-3
    # the padding nodes' token (pad_id) does not change any valid row
    t2 = tensorize(make_tree(root, [5, 6, 9, 9], [0, 0, 1, 2]), length, BUDGET, MAX_DEPTH, pad_id=17)
    out2 = runner.verify(t2)
    np.testing.assert_array_equal(out.logits[:5], out2.logits[:5])
