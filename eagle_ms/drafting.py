"""EAGLE-2 dynamic draft tree under a node budget (host side, NumPy).

Given the draft's top-k at the root pair, grow the tree depth by depth:

  depth 1     the top-k draft tokens of the root pair; score = log p (k candidates);
  depth t+1   the k frontier nodes of depth t go to the draft in ONE fixed-shape ``expand`` call; each
              proposes its top-k children (k^2 candidates, score = parent score + log p); the global
              top-k of those k^2 become the next frontier;
  rerank      after ``max_depth`` depths keep the best ``budget`` candidates of the whole tree.

Ranking key (everywhere): higher score first, ties by creation index (the order candidates were
made: depth 1 in top-k order, then frontier row by row, children in top-k order). A child's score is
``parent + log p`` with ``log p <= 0`` (clamped), and it is created after its parent, so a child never
outranks its parent: the kept set is always a connected tree, even with ties.

Early stop (exact): every candidate a further depth could create descends from the current frontier,
so its score is <= the best frontier score, and it would be created after every existing candidate.
If ``budget`` candidates already rank at or above that bound (the budget-th best score >= the best
frontier score), no future candidate can enter the final top-``budget``: the result is the same as
drafting all ``max_depth`` depths. E.g. ``budget=1`` always stops after depth 1.

Depth cut (``min_path_prob`` p > 0, changes the tree, never the output): stop growing once every
frontier path's draft probability is below p (best frontier score < log p), then rerank what exists.
The idea: a further depth only adds nodes the draft rates below p, while each ``expand`` call costs a
fixed fraction of a teacher step. Measured on the demo pair it LOSES (docs/results.md §2: 1.74x at
p = 0, 1.62x at p = 0.1, 1.56x at p = 0.2) because the draft's path probabilities underestimate how
often greedy verification accepts, so it is off by default (p = 0: the EAGLE-2 tree, grown to
``max_depth`` or the exact early stop). Kept as a knob for pairs whose draft is calibrated.
E.g. p = 0.2 with the root top-k log p = (-0.1, -2.0): best frontier -0.1 >= log 0.2 = -1.61, expand;
if depth 2's best frontier score is -1.7, stop and rerank what exists.

Worked example (k = 2, budget = 3, max_depth = 2): root top-2 = tokens (7, 9) with log p (-0.1, -2.0)
-> candidates #0 (7, -0.1), #1 (9, -2.0). Expand #0 and #1: children of #0 = (3, -0.2) (5, -1.5) ->
#2 score -0.3, #3 -1.6; children of #1 = (3, -0.1) (8, -0.5) -> #4 -2.1, #5 -2.5. Rerank: #0 -0.1,
#2 -0.3, #3 -1.6 -> nodes 1: 7 (parent root), 2: 3 (parent 1), 3: 5 (parent 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from eagle_ms.config import check_int, check_min_path_prob, check_tree_shape, fail
from eagle_ms.tree import DraftTree

# expand(depth t, parent_rows [k] int, tokens [k] int) -> (logprob [k, K] float, target ids [k, K] int)
# parent_rows[j]: the row of the previous call that the j-th new frontier node is a child of (all 0 at
# depth 1: the root pair). tokens: the frontier nodes' (target) tokens, the draft input of this call.
ExpandFn = Callable[[int, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class TreeParams:
    """Node budget M, depth bound Dmax, per-node children k, depth cut p (module doc). Validated."""

    budget: int
    max_depth: int
    top_k: int
    min_path_prob: float = 0.0

    def __post_init__(self):
        check_tree_shape(self.budget, self.max_depth, self.top_k)  # the speculative.* rules (config.py)
        check_min_path_prob(self.min_path_prob)

    @property
    def scratch_slots(self) -> int:
        """Draft-cache scratch slots the expansions write: k per depth 1..Dmax-1."""
        return (self.max_depth - 1) * self.top_k

    @property
    def max_candidates(self) -> int:
        return self.top_k + (self.max_depth - 1) * self.top_k ** 2

    def shallow(self, depth: int) -> "TreeParams":
        """The shallow tree of ``speculative.shallow_depth`` (eagle_ms/depth_policy.py): depth <= ``depth``,
        budget min(M, k + (depth-1) k^2) (every candidate of those depths), the same k and depth cut.
        Example: M 24, k 2, depth 4 -> budget 14, max_depth 4."""
        check_int("speculative.shallow_depth", depth, 1, below=(self.max_depth, "speculative.max_depth"))
        cut = TreeParams(self.budget, depth, self.top_k)
        return TreeParams(min(self.budget, cut.max_candidates), depth, self.top_k, self.min_path_prob)

    def check_fits(self, draft_vocab_size: int, teacher_capacity: int, draft_scratch: int | None = None) -> None:
        """ValueError naming the key unless k <= draft vocabulary, a tree fits the teacher cache and the
        expansions fit the draft cache's scratch region (``draft_scratch`` slots)."""
        if self.top_k > draft_vocab_size:
            fail("speculative.top_k", self.top_k, f"must be <= the draft vocabulary size {draft_vocab_size}")
        if self.budget + 1 > teacher_capacity:
            fail("speculative.budget", self.budget, f"a tree of budget+1 nodes must fit the teacher cache ({teacher_capacity})")
        if self.max_depth + 1 > teacher_capacity:
            fail("speculative.max_depth", self.max_depth, f"max_depth+1 must fit the teacher cache ({teacher_capacity})")
        if draft_scratch is not None and self.scratch_slots > draft_scratch:
            fail("speculative.max_depth", self.max_depth, f"(max_depth-1)*top_k = {self.scratch_slots} "
                 f"expansion slots exceed the draft cache scratch region ({draft_scratch})")


@dataclass(frozen=True)
class TreeBuild:
    """The kept tree plus how it was made (for traces)."""

    tree: DraftTree
    expand_calls: int  # draft expand calls made (<= max_depth - 1)
    candidates: int  # candidates scored in total


def rank_order(scores: np.ndarray) -> np.ndarray:
    """Indices by (score descending, index ascending). Example: [-1, -0.5, -1] -> [1, 0, 2]."""
    return np.lexsort((np.arange(scores.size), -scores))


class _Candidates:
    """Growing arrays of candidates in creation order; parent -1 = the root."""

    def __init__(self):
        self.tokens: list[np.ndarray] = []
        self.parents: list[np.ndarray] = []
        self.scores: list[np.ndarray] = []
        self.size = 0

    def add(self, tokens, parents, scores) -> np.ndarray:
        ids = np.arange(self.size, self.size + tokens.size)
        self.tokens.append(np.asarray(tokens, np.int64).reshape(-1))
        self.parents.append(np.asarray(parents, np.int64).reshape(-1))
        self.scores.append(np.asarray(scores, np.float64).reshape(-1))
        self.size += tokens.size
        return ids

    def arrays(self):
        return np.concatenate(self.tokens), np.concatenate(self.parents), np.concatenate(self.scores)


def _can_stop(all_scores: np.ndarray, frontier_scores: np.ndarray, budget: int) -> bool:
    """True when the budget-th best score >= every score a further depth could produce (see module doc)."""
    if all_scores.size < budget:
        return False
    kth = np.partition(-all_scores, budget - 1)[budget - 1]  # -(budget-th best score)
    return -kth >= frontier_scores.max()


def select_tree(root_token: int, tokens: np.ndarray, parents: np.ndarray, scores: np.ndarray,
                budget: int) -> DraftTree:
    """Rerank candidates (parents[i] < i, -1 = root) and keep the best ``budget`` as a DraftTree whose
    nodes are in creation order (so parents precede children)."""
    keep = np.sort(rank_order(scores)[:budget])  # creation order
    node_of = np.full(scores.size, -1, np.int64)
    node_of[keep] = np.arange(1, keep.size + 1)
    par = parents[keep]
    node_par = np.where(par < 0, 0, node_of[np.maximum(par, 0)])
    assert np.all(node_par >= 0) and np.all(node_par < np.arange(1, keep.size + 1)), "disconnected rerank"
    return DraftTree(int(root_token), tokens[keep], node_par, scores[keep])


def build_tree(root_token: int, root_logprob: np.ndarray, root_ids: np.ndarray, expand: ExpandFn,
               params: TreeParams, early_stop: bool = True) -> TreeBuild:
    """The EAGLE-2 tree (module doc). root_logprob/root_ids [K >= k]: the root pair's top-K, descending."""
    k = params.top_k
    cands = _Candidates()
    lp = np.minimum(np.asarray(root_logprob, np.float64)[:k], 0.0)
    frontier = cands.add(np.asarray(root_ids)[:k], np.full(k, -1), lp)  # candidate ids, ranked
    frontier_scores = lp
    parent_rows = np.zeros(k, np.int64)
    calls = 0
    cut = np.log(params.min_path_prob) if params.min_path_prob > 0 else -np.inf
    for depth in range(1, params.max_depth):
        all_scores = np.concatenate(cands.scores)
        if early_stop and _can_stop(all_scores, frontier_scores, params.budget):
            break
        if frontier_scores.max() < cut:
            break
        lp, ids = expand(depth, parent_rows, np.concatenate(cands.tokens)[frontier])
        calls += 1
        lp = np.minimum(np.asarray(lp, np.float64)[:, :k], 0.0)  # [k rows, k children]
        child_scores = frontier_scores[:, None] + lp  # [k, k]
        new = cands.add(np.asarray(ids)[:, :k], np.repeat(frontier, k), child_scores)
        top = rank_order(child_scores.reshape(-1))[:k]  # ties -> lower creation index (row-major)
        frontier, frontier_scores, parent_rows = new[top], child_scores.reshape(-1)[top], top // k
    tokens, parents, scores = cands.arrays()
    return TreeBuild(select_tree(root_token, tokens, parents, scores, params.budget), calls, cands.size)
