"""Acceptance of a verified draft tree (NumPy only, no model calls).

Greedy acceptance: the teacher's argmax at node n predicts the token that follows n. Along a
root-to-leaf path [n_0 = 0, n_1, ..., n_d], draft n_i is accepted while
tokens[n_i] == target_argmax[n_{i-1}] holds for every i <= a. The longest accepted prefix over
all paths wins (ties: lowest path index); the teacher's argmax at its last node is the bonus token.
Because the target is greedy, the emitted tokens equal those of plain greedy decoding.

Sample-and-match acceptance (temperature > 0) is the same walk with the argmax replaced by one teacher
sample per node: node k's sample is the token drawn (eagle_ms/sampling.py) from the teacher's processed
distribution at node k, keyed to position_ids[k] + 1, the position of the token that follows node k. A
child is accepted while its token equals its parent's sample; the sample at the last accepted node is
the bonus. Why the output is then the teacher's own (position-keyed) sample: docs/architecture.md.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from eagle_ms.config import SamplingParams
from eagle_ms.sampling import sample_rows
from eagle_ms.tree import TreeTensors

__all__ = ["AcceptResult", "greedy_accept", "sample_accept", "tree_samples", "accepted_is_contiguous"]


@dataclasses.dataclass(frozen=True, eq=False)
class AcceptResult:
    """Outcome of one verify step (A = accepted draft tokens, 0 <= A <= max_depth)."""

    node_ids: np.ndarray  # [A+1] int32, accepted path node ids, root first
    accepted_len: int     # A
    tokens: np.ndarray    # [A+1] int32, the A accepted draft tokens then the bonus token
    bonus_token: int      # target_argmax (or target_sample) [node_ids[-1]]
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
    return _walk(t, target_argmax, "target_argmax")


def sample_accept(t: TreeTensors, target_sample: np.ndarray) -> AcceptResult:
    """Sample-and-match: the walk of ``greedy_accept`` with the argmax replaced by the per-node sample.

    target_sample: [N] int, node k's teacher sample (drawn at position position_ids[k] + 1); nodes
    that no match can reach may hold -1 (``tree_samples``), as no accepted path reads them. The
    worked example of ``greedy_accept`` holds with target_argmax renamed target_sample.
    """
    return _walk(t, target_sample, "target_sample")


def tree_samples(t: TreeTensors, logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The per-node samples ``sample_accept`` reads: logits [N, V] (verify rows) -> int32 [N].

    Node k's sample is drawn at position position_ids[k] + 1. Only nodes the walk can reach are drawn,
    depth by depth: the root, then every valid node whose token equals its (drawn) parent's sample;
    the others hold -1. ``sample_accept`` gives the same result as with every node
    drawn, because every node an accepted path or the bonus reads is reached.

    Example: root sample 7, children 1 (token 7) and 2 (token 8): node 1 is drawn, node 2 and its
    subtree are not (-1).
    """
    target = np.full(t.num_nodes, -1, np.int32)
    rows, depth = np.zeros(1, np.int64), 0  # the root first
    while rows.size:
        target[rows] = sample_rows(logits[rows], t.position_ids[rows] + 1, params)
        depth += 1
        rows = np.flatnonzero(t.valid & (t.depth == depth) & (t.tokens == target[t.parent]))
    return target


def _walk(t: TreeTensors, target: np.ndarray, name: str) -> AcceptResult:
    """The acceptance walk over ``target`` [N] (argmax or sample per node)."""
    n = t.num_nodes
    target = np.asarray(target)
    if target.shape != (n,) or (target.size and target.dtype.kind not in "iu"):
        raise ValueError(f"{name} must be an integer array of shape ({n},), got shape "
                         f"{target.shape} dtype {target.dtype}")
    if t.num_paths < 1:
        raise ValueError(f"tree has num_paths={t.num_paths}; it needs at least the root path")
    paths = t.paths[:t.num_paths]                                   # [P', D+1]
    lengths = t.path_lengths[:t.num_paths]                          # [P']
    drafted = t.tokens[paths[:, 1:]]                                # [P', D] token at n_i
    predicted = target[paths[:, :-1]]                               # [P', D] target at n_{i-1}
    in_path = np.arange(1, paths.shape[1])[None, :] < lengths[:, None]  # [P', D]
    ok = (drafted == predicted) & in_path                           # [P', D]
    accepted = np.cumprod(ok, axis=1).sum(axis=1)                   # [P'] accepted drafts
    best = int(np.argmax(accepted))                                 # first max = lowest index
    a = int(accepted[best])
    node_ids = paths[best, :a + 1].astype(np.int32)                 # [A+1]
    bonus = int(target[node_ids[-1]])
    tokens = np.append(t.tokens[node_ids[1:]], bonus).astype(np.int32)  # [A+1]
    return AcceptResult(node_ids=node_ids, accepted_len=a, tokens=tokens, bonus_token=bonus,
                        path_index=best)


def accepted_is_contiguous(result: AcceptResult) -> bool:
    """True iff node_ids == [0, 1, ..., A]: the accepted K/V already sit in order (commit by
    length); otherwise the cache must gather them (commit by path)."""
    return bool(np.array_equal(result.node_ids, np.arange(result.accepted_len + 1)))
