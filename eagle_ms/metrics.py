"""Every benchmark metric, defined once (docs/metrics.md is the prose form of this module).

Inputs are plain numbers taken from traces; nothing here runs a model.

- ``accept_L`` of a verify step = accepted draft tokens A (the paper's L_k; the bonus token not counted).
  Statistics are over all verify steps of all turns, flattened: mean, p50, p90, p99.
- ``tau`` = tokens per verify step = A + 1 (bonus), averaged over the same flattened steps
  (= mean accept_L + 1).
- ``accept_pos[d]`` (d = 1..Dmax) = share of verify steps whose accepted path reaches depth d (A >= d).
  ``accept_pos[1]`` is the share of steps that accept at least one draft; the curve never increases.
- tokens/s of a run = generated tokens / wall time of the whole generation call (prefill included).
- speedup of a turn = EA tokens/s / baseline tokens/s of that turn (same prompt, same process).
  Table 1 reports the mean, p50, p90, p99 over turns of the per-turn values (so p50 speedup is NOT
  p50 EA tok/s / p50 baseline tok/s); ``speedup_of_means`` = mean EA tok/s / mean baseline tok/s.
- acceptance by context position: each verify step is put in the bucket of its committed context length
  (KV-cache length, the RoPE position of the tree root) ``prompt_tokens + sum of (A + 1) over the turn's
  earlier steps``, buckets of ``POSITION_BUCKET`` tokens; per bucket: drafted steps (teacher-only steps
  advance the position but are left out), their mean accept_L and tau. Shows where in a long context
  acceptance decays (a draft trained on short sequences, a teacher past its training length).
- step costs (fallback-off runs): ``t_dec`` = mean baseline seconds per decoded token (wall time minus
  prefill, over the tokens after the prefill's); ``t_ver`` = mean verify-stage seconds of the drafted EA
  steps; ``overhead`` = mean seconds of the other stages of those steps (draft, tensorize, mask, accept,
  commit, observe). ``bound`` = tau_drafted * t_dec / t_ver is the speedup with free drafting and free host
  work; ``efficiency`` = mean per-turn speedup / bound (1 = the tree's whole gain reaches the user).
- exactness = share of turns whose EA tokens equal the baseline tokens exactly (same length too).
- margin at a mismatch = teacher logit top-1 minus top-2 at the first differing position, from a
  teacher forward over prompt + common prefix (a small margin = a numerical near-tie).

Percentiles use linear interpolation between order statistics (``numpy.percentile`` default):
for sorted x_0..x_{n-1}, p_q = x_i + f (x_{i+1} - x_i) with i + f = q/100 (n - 1).
Example: [0, 1, 2, 3, 10] -> p50 = 2, p90 = 3 + 0.6 * 7 = 7.2, p99 = 3 + 0.96 * 7 = 9.72.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

PERCENTILES = (50, 90, 99)
POSITION_BUCKET = 256  # tokens of context per bucket of the acceptance-by-position table


def describe(values: Iterable[float]) -> dict:
    """{"n", "mean", "p50", "p90", "p99"}; every statistic None when there are no values."""
    arr = np.asarray(list(values), dtype=np.float64)
    out = {"n": int(arr.size), "mean": float(arr.mean()) if arr.size else None}
    for q in PERCENTILES:
        out[f"p{q}"] = float(np.percentile(arr, q)) if arr.size else None
    return out


def tau(accepted_lengths: Sequence[int]) -> float | None:
    """Mean tokens per verify step: mean(A + 1) over the given steps; None for no steps."""
    return float(np.mean(accepted_lengths) + 1.0) if len(accepted_lengths) else None


def accept_pos(accepted_lengths: Sequence[int], max_depth: int) -> list[float | None]:
    """[share of steps with A >= d for d = 1..max_depth]; Nones when there are no steps.

    Example: A = [0, 1, 3], max_depth 3 -> [2/3, 1/3, 1/3].
    """
    a = np.asarray(accepted_lengths, dtype=np.int64)
    if not a.size:
        return [None] * max_depth
    return [float(np.mean(a >= d)) for d in range(1, max_depth + 1)]


def step_positions(prompt_tokens: int, accepted_lengths: Sequence[int]) -> np.ndarray:
    """[steps] committed context length at the start of each verify step of one turn (module doc).

    Example: prompt 10, A = [2, 0, 3] -> [10, 13, 14].
    """
    a = np.asarray(accepted_lengths, dtype=np.int64)
    return prompt_tokens + np.concatenate(([0], np.cumsum(a + 1)[:-1])) if a.size else a


def accept_by_position(turns: Iterable[tuple[int, Sequence[int], Sequence[bool]]], bucket: int) -> list[dict]:
    """[{"from", "to", "steps", "accept_L", "tau"}] per bucket [from, to) of context length holding drafted
    steps, ascending, over the (prompt_tokens, accepted lengths, drafted flags) of every turn. Every step
    advances the position; only drafted steps (not teacher-only ones) enter the statistics.

    Example: turns [(10, [2, 0, 3], [T, F, T]), (300, [1], [T])], bucket 256 -> positions 10, 13, 14 | 300:
    [{from 0, to 256, steps 2, accept_L 5/2, tau 7/2}, {from 256, to 512, steps 1, accept_L 1, tau 2}].
    """
    if bucket < 1:
        raise ValueError(f"position bucket must be >= 1, got {bucket}")
    groups: dict[int, list[int]] = {}
    for prompt_tokens, accepted, drafted in turns:
        for pos, a, d in zip(step_positions(prompt_tokens, accepted), accepted, drafted):
            if d:
                groups.setdefault(int(pos) // bucket, []).append(int(a))
    return [{"from": b * bucket, "to": (b + 1) * bucket, "steps": len(v), "accept_L": float(np.mean(v)),
             "tau": tau(v)} for b, v in sorted(groups.items())]


def accept_after(turns: Iterable[tuple[Sequence[int], Sequence[bool]]]) -> list[dict]:
    """[{"previous", "steps", "accept_L"}]: the mean accept_L of drafted steps grouped by the accept_L of the
    drafted step before them in the same turn (ascending), over the (accepted lengths, drafted flags) of every
    turn; a turn's first drafted step has no previous one. Acceptance streaks: what
    ``speculative.shallow_depth`` (eagle_ms/depth_policy.py) exploits.

    Example: turns [([3, 0, 1, 5], [T, T, F, T])] -> drafted 3, 0, 5: pairs (3 -> 0), (0 -> 5):
    [{previous 0, steps 1, accept_L 5}, {previous 3, steps 1, accept_L 0}].
    """
    groups: dict[int, list[int]] = {}
    for accepted, drafted in turns:
        seq = [int(a) for a, d in zip(accepted, drafted) if d]
        for prev, a in zip(seq, seq[1:]):
            groups.setdefault(prev, []).append(a)
    return [{"previous": p, "steps": len(v), "accept_L": float(np.mean(v))} for p, v in sorted(groups.items())]


def tokens_per_s(n_tokens: int, wall_s: float) -> float:
    return n_tokens / wall_s if wall_s > 0 else 0.0


def speedup(ea_tokens_per_s: float, baseline_tokens_per_s: float) -> float | None:
    """Per-turn speedup; None when the baseline rate is zero (nothing generated)."""
    return ea_tokens_per_s / baseline_tokens_per_s if baseline_tokens_per_s > 0 else None


def step_costs(baseline_decode_s: Sequence[float], verify_s: Sequence[float], overhead_s: Sequence[float],
               tau_drafted: float | None, speedup_mean: float | None) -> dict:
    """t_dec / t_ver / overhead in ms, the free-drafting bound and the efficiency (module doc); None where
    an input is missing."""
    t_dec, t_ver, over = (float(np.mean(v)) if len(v) else None for v in (baseline_decode_s, verify_s, overhead_s))
    bound = tau_drafted * t_dec / t_ver if None not in (tau_drafted, t_dec, t_ver) and t_ver > 0 else None
    return {"t_dec_ms": None if t_dec is None else 1e3 * t_dec, "t_ver_ms": None if t_ver is None else 1e3 * t_ver,
            "overhead_ms": None if over is None else 1e3 * over,
            "overhead_over_t_dec": over / t_dec if over is not None and t_dec else None,
            "bound": bound, "efficiency": speedup_mean / bound if bound and speedup_mean is not None else None}


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (a length difference counts at the
    shorter length); None when they are identical. Example: [1,2,3] vs [1,5] -> 1; [1,2] vs [1,2,3] -> 2."""
    n = min(len(a), len(b))
    for i in range(n):
        if int(a[i]) != int(b[i]):
            return i
    return None if len(a) == len(b) else n


def exactness(identical: Sequence[bool]) -> float | None:
    """Share of turns whose EA tokens equal the baseline tokens; None for no turns."""
    return float(np.mean(np.asarray(identical, dtype=bool))) if len(identical) else None


def logit_margin(logits: np.ndarray, baseline_token: int | None, ea_token: int | None) -> dict:
    """Teacher logits [V] at a mismatch -> top-1/top-2 ids, ``margin`` = l[top1] - l[top2] and
    ``gap`` = l[baseline token] - l[EA token] (None when one run had no token there)."""
    logits = np.asarray(logits, dtype=np.float64)
    order = np.argsort(-logits, kind="stable")[:2]
    out = {"top1": int(order[0]), "top2": int(order[1]),
           "margin": float(logits[order[0]] - logits[order[1]]), "gap": None}
    if baseline_token is not None and ea_token is not None:
        out["gap"] = float(logits[baseline_token] - logits[ea_token])
    return out


def stage_stats(samples: Mapping[str, Sequence[float]]) -> dict:
    """{stage: {"n", "mean_ms", "p99_ms", "p99_over_mean", "total_s"}} from per-sample seconds."""
    out = {}
    for stage, values in samples.items():
        arr = np.asarray(values, dtype=np.float64)
        if not arr.size:
            continue
        mean = float(arr.mean())
        p99 = float(np.percentile(arr, 99))
        out[stage] = {"n": int(arr.size), "mean_ms": 1e3 * mean, "p99_ms": 1e3 * p99,
                      "p99_over_mean": p99 / mean if mean > 0 else None, "total_s": float(arr.sum())}
    return out
