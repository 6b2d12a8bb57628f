"""Held-out acceptance of the TTT simulation (NumPy, host side).

For step i and row j the draft has been fed the data's tokens ids[j+1 .. j+1+i] and its own features
(eagle_ms.train.ttt). Its top-1 (mapped to a target id) is compared with the teacher's argmax at the
target position j+1+i; positions count when loss_mask[j+1+i] = 1 (the batch mask: token j+2+i is an
assistant token; a teacher argmax outside the draft
vocabulary counts as a miss here, unlike in the loss, where it is masked).

    acc[i]       = P(step i correct)                                    (per-step top-1 acceptance)
    cond_acc[i]  = P(step i correct | steps 0..i-1 correct on that row)  (chain acceptance)
    accept_len   = sum_k prod_{i<=k} cond_acc[i]   expected accepted draft tokens of a greedy chain of
                                                  length S (the bonus token excluded)
    accept_len_uncond = sum_k prod_{i<=k} acc[i]   (SpecForge's ``simulated_acc_len``)

When the data is the teacher's own greedy output (``eagle-ms regenerate``, temperature 0), the teacher
argmax at t is ids[t+1] on answer positions, so a row whose steps 0..i-1 were correct was fed exactly
the tokens the draft itself proposed: cond_acc is then the acceptance of an actual chain draft.
Example: acc = [0.8, 0.6], cond_acc = [0.8, 0.7] -> accept_len = 0.8 + 0.8*0.7 = 1.36.
"""
from __future__ import annotations

import numpy as np

FIELDS = ("valid", "correct", "chain_num", "chain_den", "ce_sum", "ce_count")


def _shift(x: np.ndarray, s: int) -> np.ndarray:
    out = np.zeros_like(x)
    out[:, :x.shape[1] - s] = x[:, s:]
    return out


def batch_counts(tops: np.ndarray, argmax: np.ndarray, loss_mask: np.ndarray, ce_sums: np.ndarray,
                 ce_counts: np.ndarray) -> np.ndarray:
    """Counts [len(FIELDS), S] of one batch. tops [S,B,T] draft top-1 target ids; argmax [B,T] teacher
    argmax; loss_mask [B,T]; ce_sums/ce_counts [S] from TTTEval."""
    steps = tops.shape[0]
    out = np.zeros((len(FIELDS), steps), np.float64)
    run = np.ones(argmax.shape, bool)
    for i in range(steps):
        target = _shift(argmax, i + 1)
        valid = _shift(loss_mask, i + 1) > 0
        hit = tops[i] == target
        out[0, i] = valid.sum()
        out[1, i] = (hit & valid).sum()
        out[3, i] = (run & valid).sum()
        run = run & hit
        out[2, i] = (run & valid).sum()
    out[4], out[5] = ce_sums, ce_counts
    return out


def summarize(counts: np.ndarray, decay: float) -> dict:
    """Metrics (module doc) from summed counts [len(FIELDS), S]."""
    c = dict(zip(FIELDS, counts))
    acc = c["correct"] / np.maximum(c["valid"], 1)
    cond = c["chain_num"] / np.maximum(c["chain_den"], 1)
    weights = decay ** np.arange(counts.shape[1])
    loss = float(np.sum(weights * c["ce_sum"] / np.maximum(c["ce_count"], 1)))
    return {"loss": loss, "acc": [round(float(a), 6) for a in acc], "cond_acc": [round(float(a), 6) for a in cond],
            "accept_len": float(np.sum(np.cumprod(cond))), "accept_len_uncond": float(np.sum(np.cumprod(acc))),
            "positions": int(c["valid"][0])}
