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

By answer offset (``band_counts``, ``summarize_bands``): row j is the chain drafted after committing
tokens 0..j with root token j+1, so its answer offset is the root's index in its assistant run (0 = the
answer's first token), the same position the benchmark's acceptance-by-answer-offset table uses (the
committed length at a step's start minus the prompt: eagle_ms/metrics.py). Rows whose root is not an
assistant token have offset -1 and count in no band. Example: batch mask row [0, 1, 1, 1, 0] (tokens
2..4 are the answer) -> offsets [-1, 0, 1, 2, -1].
"""
from __future__ import annotations

import numpy as np

FIELDS = ("valid", "correct", "chain_num", "chain_den", "ce_sum", "ce_count")


def _shift(x: np.ndarray, s: int) -> np.ndarray:
    out = np.zeros_like(x)
    out[:, :x.shape[1] - s] = x[:, s:]
    return out


def batch_counts(tops: np.ndarray, argmax: np.ndarray, loss_mask: np.ndarray, ce_sums: np.ndarray,
                 ce_counts: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Counts [len(FIELDS), S] of one batch. tops [S,B,T] draft top-1 target ids; argmax [B,T] teacher
    argmax; loss_mask [B,T]; ce_sums/ce_counts [S] from TTTEval; rows [B,T] bool (None: all): only the
    chains of these rows count."""
    steps = tops.shape[0]
    out = np.zeros((len(FIELDS), steps), np.float64)
    run = np.ones(argmax.shape, bool)
    for i in range(steps):
        target = _shift(argmax, i + 1)
        valid = _shift(loss_mask, i + 1) > 0
        if rows is not None:
            valid = valid & rows
        hit = tops[i] == target
        out[0, i] = valid.sum()
        out[1, i] = (hit & valid).sum()
        out[3, i] = (run & valid).sum()
        run = run & hit
        out[2, i] = (run & valid).sum()
    out[4], out[5] = ce_sums, ce_counts
    return out


def acceptance(valid, correct, chain_num, chain_den) -> dict:
    """{"acc", "cond_acc", "accept_len"} (module doc) from the first four FIELDS' counts, each [S]."""
    cond = chain_num / np.maximum(chain_den, 1)
    return {"acc": [round(float(a), 6) for a in correct / np.maximum(valid, 1)],
            "cond_acc": [round(float(a), 6) for a in cond], "accept_len": float(np.sum(np.cumprod(cond)))}


def summarize(counts: np.ndarray, decay: float) -> dict:
    """Metrics (module doc) from summed counts [len(FIELDS), S]."""
    c = dict(zip(FIELDS, counts))
    acc = c["correct"] / np.maximum(c["valid"], 1)
    weights = decay ** np.arange(counts.shape[1])
    loss = float(np.sum(weights * c["ce_sum"] / np.maximum(c["ce_count"], 1)))
    return {"loss": loss, **acceptance(*counts[:4]), "accept_len_uncond": float(np.sum(np.cumprod(acc))),
            "positions": int(c["valid"][0])}


def answer_offsets(loss_mask: np.ndarray) -> np.ndarray:
    """Batch mask [B,T] -> [B,T] int64: row j's root (token j+1) index in its assistant run, -1 outside
    one (module doc)."""
    out = np.full(loss_mask.shape, -1, np.int64)
    run = np.zeros(loss_mask.shape[0], np.int64)
    for t in range(loss_mask.shape[1]):
        on = loss_mask[:, t] > 0
        run = np.where(on, run + 1, 0)
        out[:, t] = run - 1
    return out


def band_counts(tops: np.ndarray, argmax: np.ndarray, loss_mask: np.ndarray, width: int,
                bands: int) -> np.ndarray:
    """Counts [bands, 4, S] (the first four FIELDS) by answer-offset band [k*width, (k+1)*width);
    offsets past the last band go into it."""
    offsets = answer_offsets(loss_mask)
    band = np.where(offsets >= 0, np.minimum(offsets // width, bands - 1), -1)
    zeros = np.zeros(tops.shape[0])
    return np.stack([batch_counts(tops, argmax, loss_mask, zeros, zeros, rows=band == k)[:4] for k in range(bands)])


def summarize_bands(counts: np.ndarray, width: int) -> list[dict]:
    """[{"from", "to", "positions", "acc", "cond_acc", "accept_len"}] per band with positions, from
    ``band_counts`` sums [bands, 4, S]; the last band's "to" is None (it holds every later offset)."""
    return [{"from": k * width, "to": (k + 1) * width if k < len(counts) - 1 else None, "positions": int(c[0][0]),
             **acceptance(*c)} for k, c in enumerate(counts) if c[0][0] > 0]
