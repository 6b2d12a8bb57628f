"""The test drafter (``--draft test``): random trees around the teacher's own greedy continuation.

It needs no training: it is given the teacher-only greedy output for the prompt and proposes trees in
which the true continuation appears with seeded random corruption and random branching, so some
paths are right, some wrong, at random depths, and the right child is not always the first sibling
(exercising the out-of-order commit). Used by the losslessness tests and smoke runs: speculative
output must equal teacher-only output whatever the tree.
"""
from __future__ import annotations

import numpy as np

from eagle_ms.tree import DraftTree


class OracleDrafter:
    """Drafter protocol of ``eagle_ms.generate``; ``continuation[0]`` is the first generated token."""

    def __init__(self, continuation, vocab_size: int, budget: int, max_depth: int,
                 error_rate: float = 0.3, branching: int = 2, seed: int = 0):
        if budget < 1 or max_depth < 1:
            raise ValueError(f"budget {budget} and max_depth {max_depth} must be >= 1")
        self.continuation = np.asarray(continuation, dtype=np.int64)
        self.vocab_size = vocab_size
        self.budget, self.max_depth = budget, max_depth
        self.error_rate, self.branching = error_rate, branching
        self.rng = np.random.default_rng(seed)
        self.pos = 0  # index in continuation of the current root

    def begin(self, prompt_ids, prompt_aux, root: int) -> None:
        self.pos = 0

    def observe(self, committed, aux, next_root: int) -> None:
        self.pos += len(committed)

    def _true_token(self, depth: int) -> int | None:
        i = self.pos + depth
        return int(self.continuation[i]) if i < self.continuation.size else None

    def propose(self, root: int, params=None) -> DraftTree:
        """Breadth-first random tree: ids increase with depth, so every parent precedes its children.
        ``params`` (a TreeParams, e.g. ``speculative.shallow_depth``'s): its budget and max_depth instead of
        this drafter's."""
        budget, max_depth = (self.budget, self.max_depth) if params is None else (params.budget, params.max_depth)
        tokens, parents, on_truth = [], [], []
        frontier = [(0, True)]  # (node id, whole path so far equals the true continuation)
        for depth in range(1, max_depth + 1):
            nxt = []
            for node, truthful in frontier:
                for child in range(int(self.rng.integers(1, self.branching + 1))):
                    if len(tokens) >= budget:
                        break
                    true_tok = self._true_token(depth) if truthful else None
                    use_truth = true_tok is not None and child == 0 and self.rng.random() >= self.error_rate
                    tok = true_tok if use_truth else int(self.rng.integers(0, self.vocab_size))
                    tokens.append(tok)
                    parents.append(node)
                    on_truth.append(use_truth or (true_tok is not None and tok == true_tok))
                    nxt.append((len(tokens), on_truth[-1]))
            if not nxt or len(tokens) >= budget:
                break
            self.rng.shuffle(nxt)
            frontier = nxt[: max(1, self.branching)]
        order = self._shuffle_siblings(parents)
        return self._relabel(root, tokens, parents, order)

    def _shuffle_siblings(self, parents: list[int]) -> np.ndarray:
        """A random permutation of node ids that keeps every parent before its children."""
        m = len(parents)
        keys = np.zeros(m + 1)
        depth = np.zeros(m + 1, dtype=np.int64)
        for k in range(1, m + 1):
            depth[k] = depth[parents[k - 1]] + 1
        keys[1:] = depth[1:] + self.rng.random(m) * 0.5  # sort by depth, random within a depth
        return np.argsort(keys[1:], kind="stable") + 1  # new order of old ids

    @staticmethod
    def _relabel(root: int, tokens, parents, order: np.ndarray) -> DraftTree:
        new_id = np.zeros(len(tokens) + 1, dtype=np.int64)
        new_id[order] = np.arange(1, len(tokens) + 1)
        toks = np.asarray(tokens, dtype=np.int64)[order - 1]
        pars = new_id[np.asarray(parents, dtype=np.int64)[order - 1]]
        return DraftTree(root, toks, pars, np.zeros(len(tokens)))
