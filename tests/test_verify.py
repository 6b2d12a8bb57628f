"""Greedy acceptance: crafted argmax tables and a brute-force per-path reference."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from eagle_ms.tree import DraftTree, tensorize
from eagle_ms.verify import AcceptResult, accepted_is_contiguous, greedy_accept

MISS = 0  # no draft token below is 0, so an argmax of 0 never accepts


def build(root, tokens, parents, budget=None, max_depth=None, committed_len=0):
    depth = [0]
    for p in parents:
        depth.append(depth[p] + 1)
    tree = DraftTree(root, np.array(tokens, np.int64), np.array(parents, np.int64),
                     np.zeros(len(tokens)))
    return tensorize(tree, committed_len, len(tokens) if budget is None else budget,
                     max(depth) if max_depth is None else max_depth)


def argmax_table(n, **at):
    """argmax_table(5, n0=7, n3=9) -> [7, MISS, MISS, 9, MISS]."""
    table = np.full(n, MISS, np.int64)
    for key, value in at.items():
        table[int(key[1:])] = value
    return table


def assert_result(r, node_ids, tokens, path_index):
    assert isinstance(r, AcceptResult)
    assert r.node_ids.tolist() == node_ids
    assert r.tokens.tolist() == tokens
    assert r.accepted_len == len(node_ids) - 1
    assert r.bonus_token == tokens[-1]
    assert r.path_index == path_index


# EAGLE-style tree: nodes 1..9 with tokens 21..29; leaves 3, 5, 6, 8, 9 -> path rows 0..4.
EAGLE_PARENTS = [0, 0, 0, 1, 1, 2, 4, 4, 7]
EAGLE_TOKENS = list(range(21, 30))


def test_chain_all_accepted():
    t = build(5, [10, 11, 12], [0, 1, 2])
    r = greedy_accept(t, np.array([10, 11, 12, 77]))
    assert_result(r, [0, 1, 2, 3], [10, 11, 12, 77], 0)
    assert accepted_is_contiguous(r)


def test_reject_at_depth_one():
    t = build(5, [10, 11, 12], [0, 1, 2], budget=6)
    r = greedy_accept(t, np.array([99, 11, 12, 77, 1, 1, 1]))
    assert_result(r, [0], [99], 0)
    assert accepted_is_contiguous(r)


def test_best_of_several_paths():
    t = build(20, EAGLE_TOKENS, EAGLE_PARENTS, budget=12, max_depth=5)
    # root -> 21 (node 1), node 1 -> 24 (node 4), node 4 -> 28 (node 8), node 8 -> 500 (bonus).
    # Path via node 7 (token 27) stops at A = 2; path via node 8 reaches A = 3.
    r = greedy_accept(t, argmax_table(13, n0=21, n1=24, n4=28, n8=500))
    assert_result(r, [0, 1, 4, 8], [21, 24, 28, 500], 3)
    assert not accepted_is_contiguous(r)


def test_leaf_at_max_depth():
    t = build(20, EAGLE_TOKENS, EAGLE_PARENTS, max_depth=4)
    assert t.paths.shape[1] == 5
    r = greedy_accept(t, argmax_table(10, n0=21, n1=24, n4=27, n7=29, n9=600))
    assert_result(r, [0, 1, 4, 7, 9], [21, 24, 27, 29, 600], 4)


def test_ties_go_to_lowest_path():
    t = build(100, [1, 2, 2, 3], [0, 0, 0, 0])  # nodes 2 and 3 both carry token 2
    r = greedy_accept(t, np.array([2, 50, 40, 41, 60]))
    assert_result(r, [0, 2], [2, 40], 1)
    t = build(50, [11, 12, 13, 14, 15, 16], [0, 0, 1, 1, 2, 2])
    r = greedy_accept(t, np.array([7, 7, 7, 7, 7, 7, 7]))  # every path rejects at depth 1
    assert_result(r, [0], [7], 0)


def test_padding_beyond_path_length_never_accepts():
    # Path [0, 1, 1]: the pad column repeats leaf 1, whose own token equals its argmax.
    t = build(100, [1, 2, 3, 4], [0, 0, 0, 0], max_depth=2)
    r = greedy_accept(t, np.array([1, 1, 8, 8, 8]))
    assert_result(r, [0, 1], [1, 1], 0)


def test_root_only_tree_emits_bonus():
    t = build(4, [], [], budget=3, max_depth=2)
    r = greedy_accept(t, np.array([9, 0, 0, 0]))
    assert_result(r, [0], [9], 0)


def test_rejects_bad_argmax():
    t = build(5, [10, 11], [0, 1])
    with pytest.raises(ValueError, match="shape"):
        greedy_accept(t, np.array([1, 2]))
    with pytest.raises(ValueError, match="integer"):
        greedy_accept(t, np.array([1.0, 2.0, 3.0]))


def brute_force_accept(tokens, parents, argmax):
    """Per-path Python loop over leaves in ascending id; strict '>' keeps the lowest path."""
    m = len(tokens)
    parent = [0] + list(parents)
    node_token = [None] + list(tokens)
    has_child = set(parent[1:])
    leaves = [k for k in range(1, m + 1) if k not in has_child] or [0]
    best = None
    for index, leaf in enumerate(leaves):
        path = [leaf]
        while path[-1] != 0:
            path.append(parent[path[-1]])
        path.reverse()
        a = 0
        while a + 1 < len(path) and node_token[path[a + 1]] == argmax[path[a]]:
            a += 1
        if best is None or a > best[0]:
            best = (a, index, path[:a + 1])
    a, index, nodes = best
    emitted = [node_token[k] for k in nodes[1:]] + [int(argmax[nodes[-1]])]
    return nodes, emitted, index


@st.composite
def trees_and_argmax(draw):
    m = draw(st.integers(0, 16))
    parents = [draw(st.integers(0, i)) for i in range(m)]
    tokens = draw(st.lists(st.integers(0, 3), min_size=m, max_size=m))
    budget = m + draw(st.integers(0, 4))
    argmax = draw(st.lists(st.integers(0, 3), min_size=budget + 1, max_size=budget + 1))
    return tokens, parents, budget, np.array(argmax)


@settings(max_examples=200, deadline=None)
@given(trees_and_argmax(), st.integers(0, 2))
def test_greedy_accept_matches_brute_force(case, extra_depth):
    tokens, parents, budget, argmax = case
    depth = [0]
    for p in parents:
        depth.append(depth[p] + 1)
    t = build(7, tokens, parents, budget=budget, max_depth=max(depth) + extra_depth)
    r = greedy_accept(t, argmax)
    nodes, emitted, index = brute_force_accept(tokens, parents, argmax)
    assert_result(r, nodes, emitted, index)
    assert accepted_is_contiguous(r) == (nodes == list(range(len(nodes))))
