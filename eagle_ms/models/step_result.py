"""Packed result of one device verify step: the one small int tensor the host reads per step.

Layout (the device step contract, docs/architecture.md §"Device-resident step"), D = max_depth:

    result [B, 2*(D+1)+1] int32, per sequence b:
      col 0             A, the accepted draft tokens (0..D); A = -1: no step yet (after prefill/begin)
      cols 1 .. D+1     emitted tokens: the A accepted draft tokens, then the bonus token, then 0-padding
      cols D+2 .. 2D+2  accepted node ids root first (node_ids[0] = 0), then 0-padding

Worked example, D = 3, A = 1 (draft token 17 accepted at node 2), bonus token 5:
    [1,  17, 5, 0, 0,  0, 2, 0, 0]     -> StepResult(1, tokens [17, 5], node_ids [0, 2])
and "no step yet": [-1, 0, 0, 0, 0, 0, 0, 0, 0] -> StepResult(-1, [], []).

``pack_result`` builds it in a graph (eagle_ms/models/verify_step.py); ``unpack_result`` reads it on the
host; ``pack_result_numpy`` is its inverse for tests and for the "no step yet" input of the draft graph.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

import mindspore as ms
from mindspore import ops

ACCEPTED_COLUMN = 0


class StepResult(NamedTuple):
    """One sequence's step: A, tokens [A+1] (A drafts + bonus), node_ids [A+1] (root first); int32."""

    accepted_len: int
    tokens: np.ndarray
    node_ids: np.ndarray


def result_width(max_depth: int) -> int:
    """Columns of the packed result: 2 * (max_depth + 1) + 1. Example: max_depth 3 -> 9."""
    if isinstance(max_depth, bool) or not isinstance(max_depth, (int, np.integer)) or max_depth < 1:
        raise ValueError(f"max_depth must be an integer >= 1, got {max_depth!r}")
    return 2 * (int(max_depth) + 1) + 1


def token_columns(max_depth: int) -> slice:
    """Columns of the emitted tokens: 1 .. D+1. Example: max_depth 3 -> slice(1, 5)."""
    return slice(1, max_depth + 2)


def node_columns(max_depth: int) -> slice:
    """Columns of the accepted node ids: D+2 .. 2D+2. Example: max_depth 3 -> slice(5, 9)."""
    return slice(max_depth + 2, 2 * max_depth + 3)


def pack_result(accepted, tokens, node_ids):
    """In-graph: accepted [B] int32, tokens [B, D+1], node_ids [B, D+1] (both 0-padded) -> [B, 2D+3]."""
    columns = (accepted.reshape(-1, 1).astype(ms.int32), tokens.astype(ms.int32), node_ids.astype(ms.int32))
    return ops.concat(columns, axis=1)


def unpack_result(result) -> list[StepResult]:
    """Host: result [B, 2D+3] int (a NumPy array) -> one StepResult per sequence.

    Raises ValueError naming the value for a wrong shape, an A outside [-1, D] or a node-id row that
    does not start at the root 0.
    """
    result = np.asarray(result)
    if result.ndim != 2 or result.shape[1] < 5 or result.shape[1] % 2 == 0 or result.dtype.kind not in "iu":
        raise ValueError(f"packed result must be an int array [B, 2*(D+1)+1] with D >= 1, got shape "
                         f"{result.shape} dtype {result.dtype}")
    d = (result.shape[1] - 3) // 2
    rows = []
    for b, row in enumerate(result.astype(np.int32)):
        a = int(row[ACCEPTED_COLUMN])
        if not -1 <= a <= d:
            raise ValueError(f"packed result row {b}: A = {a} outside [-1, max_depth {d}]")
        tokens, node_ids = row[token_columns(d)][:a + 1], row[node_columns(d)][:a + 1]
        if a >= 0 and node_ids[0] != 0:
            raise ValueError(f"packed result row {b}: node ids {node_ids.tolist()} do not start at the root 0")
        rows.append(StepResult(a, tokens.copy(), node_ids.copy()))
    return rows


def pack_result_numpy(rows: Sequence[StepResult], max_depth: int) -> np.ndarray:
    """Host inverse of ``unpack_result``: B StepResults (A = -1 with empty arrays for "no step yet")
    -> [B, 2D+3] int32. Raises ValueError for an A outside [-1, D] or arrays not of length A + 1."""
    out = np.zeros((len(rows), result_width(max_depth)), np.int32)
    for b, (a, tokens, node_ids) in enumerate(rows):
        tokens, node_ids = np.asarray(tokens, np.int64).ravel(), np.asarray(node_ids, np.int64).ravel()
        if not -1 <= a <= max_depth or tokens.size != a + 1 or node_ids.size != a + 1:
            raise ValueError(f"step result {b}: A = {a} needs A in [-1, {max_depth}] and {a + 1} tokens and "
                             f"node ids, got {tokens.size} and {node_ids.size}")
        out[b, ACCEPTED_COLUMN] = a
        out[b, token_columns(max_depth)][:a + 1] = tokens
        out[b, node_columns(max_depth)][:a + 1] = node_ids
    return out
