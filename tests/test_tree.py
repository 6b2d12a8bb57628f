"""Tree tensorisation: hand-written literals, brute-force properties, corrupted trees."""
import dataclasses
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from eagle_ms.tree import DraftTree, TreeInvariantError, chain_first, tensorize, verify_attention_mask
from eagle_ms.tree_checks import check_invariants

SETTINGS = settings(max_examples=150, deadline=None)


def make_tree(root, tokens, parents):
    return DraftTree(root, np.array(tokens, np.int64), np.array(parents, np.int64),
                     np.zeros(len(tokens)))


def mask_from_rows(rows):
    """'1001' strings -> bool matrix."""
    return np.array([[c == "1" for c in row] for row in rows])


def assert_tensors(t, **expected):
    for name, value in expected.items():
        got = getattr(t, name)
        if isinstance(got, np.ndarray):
            np.testing.assert_array_equal(got, np.array(value), err_msg=name)
        else:
            assert got == value, name


INT_FIELDS = ("tokens", "parent", "depth", "ancestors", "position_ids", "cache_slots", "paths",
              "path_lengths")


def assert_dtypes(t):
    for name in INT_FIELDS:
        assert getattr(t, name).dtype == np.int32, name
    assert t.valid.dtype == bool and t.tree_mask.dtype == bool


# --- hand-written literals --------------------------------------------------------------------

def test_chain_of_three():
    t = tensorize(make_tree(5, [10, 11, 12], [0, 1, 2]), committed_len=7, budget=3, max_depth=3)
    assert_dtypes(t)
    assert_tensors(
        t, tokens=[5, 10, 11, 12], parent=[0, 0, 1, 2], depth=[0, 1, 2, 3],
        valid=[True, True, True, True],
        ancestors=[[0, 1, 2, 3], [0, 0, 1, 2], [0, 0, 0, 1], [0, 0, 0, 0]],
        position_ids=[7, 8, 9, 10], cache_slots=[7, 8, 9, 10],
        tree_mask=mask_from_rows(["1000", "1100", "1110", "1111"]),
        paths=[[0, 1, 2, 3], [0, 0, 0, 0], [0, 0, 0, 0]], path_lengths=[4, 0, 0],
        num_paths=1, committed_len=7, budget=3, max_depth=3)
    check_invariants(t)


def test_star_with_padding():
    t = tensorize(make_tree(100, [1, 2, 3, 4], [0, 0, 0, 0]), committed_len=0, budget=6,
                  max_depth=2, pad_id=99)
    assert_dtypes(t)
    assert_tensors(
        t, tokens=[100, 1, 2, 3, 4, 99, 99], parent=[0] * 7, depth=[0, 1, 1, 1, 1, 0, 0],
        valid=[True] * 5 + [False] * 2,
        ancestors=[[0, 1, 2, 3, 4, 5, 6], [0] * 7, [0] * 7],
        position_ids=[0, 1, 1, 1, 1, 0, 0], cache_slots=[0, 1, 2, 3, 4, 5, 6],
        tree_mask=mask_from_rows(["1000000", "1100000", "1010000", "1001000", "1000100",
                                  "0000010", "0000001"]),
        paths=[[0, 1, 1], [0, 2, 2], [0, 3, 3], [0, 4, 4], [0, 0, 0], [0, 0, 0]],
        path_lengths=[2, 2, 2, 2, 0, 0], num_paths=4)
    check_invariants(t)


def test_binary_depth_two():
    t = tensorize(make_tree(50, [11, 12, 13, 14, 15, 16], [0, 0, 1, 1, 2, 2]),
                  committed_len=3, budget=6, max_depth=2)
    assert_tensors(
        t, tokens=[50, 11, 12, 13, 14, 15, 16], parent=[0, 0, 0, 1, 1, 2, 2],
        depth=[0, 1, 1, 2, 2, 2, 2], valid=[True] * 7,
        ancestors=[[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 2, 2], [0] * 7],
        position_ids=[3, 4, 4, 5, 5, 5, 5], cache_slots=[3, 4, 5, 6, 7, 8, 9],
        tree_mask=mask_from_rows(["1000000", "1100000", "1010000", "1101000", "1100100",
                                  "1010010", "1010001"]),
        paths=[[0, 1, 3], [0, 1, 4], [0, 2, 5], [0, 2, 6], [0, 0, 0], [0, 0, 0]],
        path_lengths=[3, 3, 3, 3, 0, 0], num_paths=4)
    check_invariants(t)


EAGLE_PARENTS = [0, 0, 0, 1, 1, 2, 4, 4, 7]  # nodes 1..9: mixed branching, depth 4


def eagle_tensors():
    return tensorize(make_tree(20, list(range(21, 30)), EAGLE_PARENTS), committed_len=20,
                     budget=12, max_depth=5)


def test_eagle_static_tree_with_padding():
    t = eagle_tensors()
    assert_dtypes(t)
    assert_tensors(
        t, tokens=[20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 0, 0, 0],
        parent=[0, 0, 0, 0, 1, 1, 2, 4, 4, 7, 0, 0, 0],
        depth=[0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 0, 0, 0],
        valid=[True] * 10 + [False] * 3,
        ancestors=[[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
                   [0, 0, 0, 0, 1, 1, 2, 4, 4, 7, 0, 0, 0],
                   [0, 0, 0, 0, 0, 0, 0, 1, 1, 4, 0, 0, 0],
                   [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
                   [0] * 13, [0] * 13],
        position_ids=[20, 21, 21, 21, 22, 22, 22, 23, 23, 24, 20, 20, 20],
        cache_slots=list(range(20, 33)),
        tree_mask=mask_from_rows([
            "1000000000000",
            "1100000000000",
            "1010000000000",
            "1001000000000",
            "1100100000000",
            "1100010000000",
            "1010001000000",
            "1100100100000",
            "1100100010000",
            "1100100101000",
            "0000000000100",
            "0000000000010",
            "0000000000001"]),
        paths=[[0, 3, 3, 3, 3, 3], [0, 1, 5, 5, 5, 5], [0, 2, 6, 6, 6, 6], [0, 1, 4, 8, 8, 8],
               [0, 1, 4, 7, 9, 9]] + [[0] * 6] * 7,
        path_lengths=[2, 3, 3, 4, 5] + [0] * 7, num_paths=5, budget=12, max_depth=5)
    check_invariants(t)


def test_root_only_tree():
    t = tensorize(make_tree(9, [], []), committed_len=4, budget=2, max_depth=1)
    assert_tensors(
        t, tokens=[9, 0, 0], parent=[0, 0, 0], depth=[0, 0, 0], valid=[True, False, False],
        ancestors=[[0, 1, 2], [0, 0, 0]], position_ids=[4, 4, 4], cache_slots=[4, 5, 6],
        tree_mask=np.eye(3, dtype=bool), paths=[[0, 0], [0, 0]], path_lengths=[1, 0],
        num_paths=1)
    check_invariants(t)
    t0 = tensorize(make_tree(9, [], []), committed_len=0, budget=0, max_depth=0)
    assert_tensors(t0, paths=[[0]], path_lengths=[1], num_paths=1, ancestors=[[0]])
    check_invariants(t0)


def test_verify_attention_mask_literal():
    t = tensorize(make_tree(5, [6, 7], [0, 0]), committed_len=2, budget=3, max_depth=1)
    allowed = verify_attention_mask(t, capacity=8)
    expected = mask_from_rows(["11100000", "11110000", "11101000", "11000100"])
    np.testing.assert_array_equal(allowed, expected)
    with pytest.raises(ValueError, match="capacity=5"):
        verify_attention_mask(t, capacity=5)


# --- hypothesis properties against brute force ------------------------------------------------

@st.composite
def random_trees(draw, max_nodes=20):
    m = draw(st.integers(0, max_nodes))
    parents = [draw(st.integers(0, i)) for i in range(m)]
    tokens = draw(st.lists(st.integers(0, 1000), min_size=m, max_size=m))
    depth = [0]
    for p in parents:
        depth.append(depth[p] + 1)
    budget = m + draw(st.integers(0, 5))
    max_depth = max(depth) + draw(st.integers(0, 3))
    committed_len = draw(st.integers(0, 50))
    return make_tree(draw(st.integers(0, 1000)), tokens, parents), committed_len, budget, max_depth


def brute_parent(tree, budget):
    return [0] + [int(p) for p in tree.parents] + [0] * (budget - tree.num_nodes)


def brute_ancestor_set(parent, k):
    seen = {k}
    while k != 0:
        k = parent[k]
        seen.add(k)
    return seen


def brute_leaf_paths(parent, m):
    children = {p for p in parent[1:m + 1]}
    paths = []
    for leaf in range(m + 1):
        if leaf not in children and (leaf > 0 or m == 0):
            chain = [leaf]
            while chain[-1] != 0:
                chain.append(parent[chain[-1]])
            paths.append(chain[::-1])
    return paths


@SETTINGS
@given(random_trees())
def test_random_trees_match_brute_force(case):
    tree, committed_len, budget, max_depth = case
    t = tensorize(tree, committed_len, budget, max_depth)
    n, m = budget + 1, tree.num_nodes
    parent = brute_parent(tree, budget)
    for name in ("parent", "ancestors", "paths"):
        arr = getattr(t, name)
        assert arr.min() >= 0 and arr.max() < n, name
    assert t.ancestors.shape == (max_depth + 1, n)
    for k in range(n):
        anc = brute_ancestor_set(parent, k) if k <= m else None
        expected_row = [j in anc for j in range(n)] if anc else [j == k for j in range(n)]
        assert t.tree_mask[k].tolist() == expected_row, k
        if anc:
            assert t.depth[k] == len(anc) - 1
            assert t.position_ids[k] == committed_len + len(anc) - 1
        assert t.cache_slots[k] == committed_len + k
    paths = brute_leaf_paths(parent, m)
    assert t.num_paths == len(paths)
    for row, path in enumerate(paths):
        assert t.path_lengths[row] == len(path)
        padded = path + [path[-1]] * (max_depth + 1 - len(path))
        assert t.paths[row].tolist() == padded
    assert not t.paths[len(paths):].any() and not t.path_lengths[len(paths):].any()
    check_invariants(t)


@SETTINGS
@given(random_trees(), st.integers(0, 6))
def test_verify_attention_mask_brute_force(case, extra):
    tree, committed_len, budget, max_depth = case
    t = tensorize(tree, committed_len, budget, max_depth)
    n, m = budget + 1, tree.num_nodes
    capacity = committed_len + n + extra
    allowed = verify_attention_mask(t, capacity)
    assert allowed.shape == (n, capacity) and allowed.dtype == bool
    parent = brute_parent(tree, budget)
    for k in range(n):
        visible = set(range(committed_len))
        nodes = brute_ancestor_set(parent, k) if k <= m else {k}
        visible |= {committed_len + j for j in nodes}
        assert allowed[k].any()
        assert {int(c) for c in np.flatnonzero(allowed[k])} == visible, k


# --- corrupted trees and bad input ------------------------------------------------------------

def corrupt(t, field, index, value):
    arr = getattr(t, field).copy()
    arr[index] = value
    return dataclasses.replace(t, **{field: arr})


CORRUPTIONS = [
    ("cycle", "parent", 1, 4, "parent_before_child"),        # 1 -> 4 -> 1
    ("self_loop", "parent", 3, 3, "parent_before_child"),
    ("parent_after_child", "parent", 4, 6, "parent_before_child"),
    ("depth_skip", "depth", 4, 3, "depth"),
    ("out_of_range_parent", "parent", 5, 13, "range"),
    ("invalid_parent_of_valid_node", "valid", 1, False, "validity_closure"),
    ("negative_parent", "parent", 2, -1, "range"),
    ("negative_ancestor", "ancestors", (2, 7), -1, "range"),
    ("negative_path_entry", "paths", (0, 1), -1, "range"),
    ("too_deep", "depth", 9, 6, "depth"),
    ("padding_not_canonical", "parent", 11, 3, "padding"),
    ("root_invalid", "valid", 0, False, "root"),
    ("stale_ancestor", "ancestors", (1, 9), 4, "ancestors"),
    ("position", "position_ids", 3, 99, "positions"),
    ("duplicate_slot", "cache_slots", 11, 30, "positions"),
    ("mask_extra_edge", "tree_mask", (3, 1), True, "mask"),
    ("padded_row_open", "tree_mask", (10, 0), True, "mask"),
    ("path_wrong_chain", "paths", (4, 3), 8, "paths"),
    ("path_length", "path_lengths", 1, 2, "paths"),
    ("unused_path_row", "paths", (6, 0), 2, "paths"),
]


@pytest.mark.parametrize("label, field, index, value, check", CORRUPTIONS,
                         ids=[c[0] for c in CORRUPTIONS])
def test_check_invariants_rejects_corruption(label, field, index, value, check):
    bad = corrupt(eagle_tensors(), field, index, value)
    with pytest.raises(TreeInvariantError) as info:
        check_invariants(bad)
    dump = info.value.dump
    assert dump["check"] == check, (label, dump["detail"])
    assert dump["parent"] == bad.parent.tolist()
    assert dump[field] == getattr(bad, field).tolist()
    assert dump["ancestors"] == bad.ancestors.tolist()
    assert (dump["committed_len"], dump["budget"], dump["max_depth"]) == (20, 12, 5)
    assert info.value.dump_path is None
    json.dumps(dump)


def test_check_invariants_rejects_wrong_num_paths_and_shapes():
    t = eagle_tensors()
    with pytest.raises(TreeInvariantError, match="num_paths"):
        check_invariants(dataclasses.replace(t, num_paths=4))
    with pytest.raises(TreeInvariantError) as info:
        check_invariants(dataclasses.replace(t, depth=t.depth[:-1]))
    assert info.value.dump["check"] == "shapes"
    with pytest.raises(TreeInvariantError) as info:
        check_invariants(dataclasses.replace(t, valid=t.valid.astype(np.int32)))
    assert info.value.dump["check"] == "shapes"


def test_failure_dump_written_to_run_dir(tmp_path):
    bad = corrupt(eagle_tensors(), "parent", 4, 6)
    with pytest.raises(TreeInvariantError) as info:
        check_invariants(bad, run_dir=str(tmp_path))
    path = info.value.dump_path
    assert path is not None and os.path.dirname(path) == str(tmp_path / "failures")
    assert os.path.basename(path).startswith("tree-") and path.endswith(".json")
    assert path in str(info.value)
    with open(path, encoding="utf-8") as handle:
        loaded = json.load(handle)
    assert loaded == info.value.dump
    assert loaded["parent"] == bad.parent.tolist() and loaded["check"] == "parent_before_child"
    with pytest.raises(TreeInvariantError) as again:
        check_invariants(bad, run_dir=str(tmp_path))
    assert again.value.dump_path != path
    assert len(os.listdir(tmp_path / "failures")) == 2


@pytest.mark.parametrize("parents", [[0, 2], [0, 1, 3], [-1], [0, -3, 1]])
def test_tensorize_rejects_bad_parents(parents):
    tree = make_tree(1, list(range(len(parents))), parents)
    with pytest.raises(TreeInvariantError) as info:
        tensorize(tree, committed_len=0, budget=8, max_depth=8)
    assert info.value.dump["parents"] == parents


def test_tensorize_rejects_bad_limits():
    chain = make_tree(1, [2, 3, 4, 5], [0, 1, 2, 3])
    with pytest.raises(ValueError, match="max_depth=3"):
        tensorize(chain, committed_len=0, budget=4, max_depth=3)
    with pytest.raises(ValueError, match="budget=3"):
        tensorize(chain, committed_len=0, budget=3, max_depth=4)
    with pytest.raises(ValueError, match="committed_len=-1"):
        tensorize(chain, committed_len=-1, budget=4, max_depth=4)
    with pytest.raises(ValueError, match="pad_id=-1"):
        tensorize(chain, committed_len=0, budget=4, max_depth=4, pad_id=-1)
    with pytest.raises(ValueError, match="budget"):
        tensorize(chain, committed_len=0, budget=2.5, max_depth=4)
    with pytest.raises(ValueError, match="token"):
        tensorize(make_tree(1, [-2], [0]), committed_len=0, budget=1, max_depth=1)


def test_draft_tree_validates_shapes():
    with pytest.raises(ValueError, match="parents"):
        DraftTree(0, np.array([1, 2]), np.array([0]), np.zeros(2))
    with pytest.raises(ValueError, match="scores"):
        DraftTree(0, np.array([1, 2]), np.array([0, 0]), np.zeros(3))
    with pytest.raises(ValueError, match="tokens"):
        DraftTree(0, np.array([[1, 2]]), np.array([0, 0]), np.zeros(2))
    with pytest.raises(ValueError, match="parents"):
        DraftTree(0, np.array([1]), np.array([0.5]), np.zeros(1))
    corrupted = DraftTree(0, [1, 2], [0, 5], [0.0, 0.0])  # structure is not checked here
    assert corrupted.parents.tolist() == [0, 5]


@st.composite
def maybe_corrupt_parents(draw):
    """Valid parent lists, with one entry overwritten by an arbitrary value half of the time."""
    m = draw(st.integers(0, 16))
    parents = [draw(st.integers(0, i)) for i in range(m)]
    if m and draw(st.booleans()):
        parents[draw(st.integers(0, m - 1))] = draw(st.integers(-4, m + 4))
    return parents


@SETTINGS
@given(maybe_corrupt_parents(), st.integers(0, 4), st.integers(0, 12))
def test_tensorize_never_emits_out_of_range(parents, extra_budget, max_depth):
    tree = make_tree(3, [7] * len(parents), parents)
    budget = len(parents) + extra_budget
    structure_ok = all(0 <= p <= i for i, p in enumerate(parents))
    try:
        t = tensorize(tree, committed_len=5, budget=budget, max_depth=max_depth)
    except TreeInvariantError:
        assert not structure_ok
        return
    except ValueError as exc:
        assert structure_ok and "max_depth" in str(exc)
        assert max(len(brute_ancestor_set([0] + parents, k)) - 1
                   for k in range(len(parents) + 1)) > max_depth
        return
    assert structure_ok
    for name in ("parent", "ancestors", "paths"):
        arr = getattr(t, name)
        assert arr.min() >= 0 and arr.max() < budget + 1
    check_invariants(t)


# ------------------------------------------------------------------------------ chain_first

def test_chain_first_docstring_example():
    tree = DraftTree(9, np.array([10, 11, 12]), np.array([0, 0, 1]), np.array([-1.0, -0.5, -1.2]))
    got = chain_first(tree)
    assert got.tokens.tolist() == [11, 10, 12] and got.parents.tolist() == [0, 0, 2]
    assert got.scores.tolist() == [-0.5, -1.0, -1.2] and got.root_token == 9


def test_chain_first_puts_the_best_chain_first_and_keeps_the_tree():
    rng = np.random.default_rng(4)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        parents = np.array([rng.integers(0, i + 1) for i in range(n)])
        scores = np.zeros(n)
        for i in range(n):  # a child never outscores its parent (as in EAGLE-2 trees)
            scores[i] = (scores[parents[i] - 1] if parents[i] else 0.0) - rng.random()
        tree = DraftTree(1, rng.integers(0, 99, n), parents, scores)
        got = chain_first(tree)
        assert np.all(got.parents < np.arange(1, n + 1))  # parents precede children

        def paths(t):  # every node as its root-to-node token path (order-free description of the tree)
            out = set()
            for k in range(1, t.num_nodes + 1):
                path, node = [], k
                while node:
                    path.append(int(t.tokens[node - 1]))
                    node = int(t.parents[node - 1])
                out.add((tuple(reversed(path)), float(t.scores[k - 1])))
            return out
        assert paths(got) == paths(tree)
        # nodes 1..d: from the root, always the best-scoring child (lowest old id on ties)
        node, depth = 0, 0
        while True:
            kids = [k for k in range(1, n + 1) if tree.parents[k - 1] == node]
            if not kids:
                break
            node = min(kids, key=lambda k: (-tree.scores[k - 1], k))
            depth += 1
            assert got.parents[depth - 1] == depth - 1
            assert got.scores[depth - 1] == tree.scores[node - 1]


def test_chain_first_rejects_bad_parents():
    with pytest.raises(ValueError, match="chain_first"):
        chain_first(DraftTree(1, np.array([5, 6]), np.array([0, 2]), np.zeros(2)))
