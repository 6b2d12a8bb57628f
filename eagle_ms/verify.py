"""Acceptance of a verified draft tree (NumPy only, no model calls).

Greedy acceptance: the teacher's argmax at node n predicts the token that follows n. Along a
root-to-leaf path [n_0 = 0, n_1, ..., n_d], draft n_i is accepted while
tokens[n_i] == target_argmax[n_{i-1}] holds for every i <= a. The longest accepted prefix over
all paths wins (ties: lowest path index); the teacher's argmax at its last node is the bonus token.
Because the target is greedy, the emitted tokens equal those of plain greedy decoding.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from eagle_ms.tree import TreeTensors

__all__ = ["AcceptResult", "greedy_accept", "accepted_is_contiguous"]


@dataclasses.dataclass(frozen=True, eq=False)
class AcceptResult:
    """Outcome of one verify step (A = accepted draft tokens, 0 <= A <= max_depth)."""

    node_ids: np.ndarray  # [A+1] int32, accepted path node ids, root first
    accepted_len: int     # A
    tokens: np.ndarray    # [A+1] int32, the A accepted draft tokens then the bonus token
    bonus_token: int      # target_argmax[node_ids[-1]]
    path_index: int       # row of t.paths the accepted prefix was taken from


def greedy_accept(t: TreeTensors, target_argmax: np.ndarray) -> AcceptResult:
    """Longest greedy-accepted prefix over the valid paths of `t`.

    target_argmax: [N] int, the teacher's argmax token at every node (row k of the verify logits).

    Worked example: paths [[0, 2, 2], [0, 1, 3]] (lengths 2, 3), tokens [r, 7, 8, 9],
    target_argmax [7, 9, 5, 4]:
        candidate tokens   tokens[paths[:, 1:]]         = [[8, 8], [7, 9]]
        predictions        target_argmax[paths[:, :-1]] = [[7, 5], [7, 9]]
        match & in-length                               = [[F, F], [T, T]]  (row 0 col 1 is pad)
        cumprod -> accepted per path                    = [0, 2]  -> path 1, A = 2
        node_ids [0, 1, 3], bonus target_argmax[3] = 4, tokens [7, 9, 4].
    """
    n = t.num_nodes
    argmax = np.asarray(target_argmax)
    if argmax.shape != (n,) or (argmax.size and argmax.dtype.kind not in "iu"):
        raise ValueError(f"target_argmax must be an integer array of shape ({n},), got shape "
                         f"{argmax.shape} dtype {argmax.dtype}")
    if t.num_paths < 1:
        raise ValueError(f"tree has num_paths={t.num_paths}; it needs at least the root path")
    paths = t.paths[:t.num_paths]                                   # [P', D+1]
    lengths = t.path_lengths[:t.num_paths]                          # [P']
    drafted = t.tokens[paths[:, 1:]]                                # [P', D] token at n_i
    predicted = argmax[paths[:, :-1]]                               # [P', D] argmax at n_{i-1}
    in_path = np.arange(1, paths.shape[1])[None, :] < lengths[:, None]  # [P', D]
    ok = (drafted == predicted) & in_path                           # [P', D]
    accepted = np.cumprod(ok, axis=1).sum(axis=1)                   # [P'] accepted drafts
    best = int(np.argmax(accepted))                                 # first max = lowest index
    a = int(accepted[best])
    node_ids = paths[best, :a + 1].astype(np.int32)                 # [A+1]
    bonus = int(argmax[node_ids[-1]])
    tokens = np.append(t.tokens[node_ids[1:]], bonus).astype(np.int32)  # [A+1]
    return AcceptResult(node_ids=node_ids, accepted_len=a, tokens=tokens, bonus_token=bonus,
                        path_index=best)


def accepted_is_contiguous(result: AcceptResult) -> bool:
    """True iff node_ids == [0, 1, ..., A]: the accepted K/V already sit in order (commit by
    length); otherwise the cache must gather them (commit by path)."""
    return bool(np.array_equal(result.node_ids, np.arange(result.accepted_len + 1)))
