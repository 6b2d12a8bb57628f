"""Low-acceptance fallback: when drafting stops paying, take teacher-only steps for a while.

A speculative step costs c teacher decode steps (draft + verify of N = M + 1 nodes + observe; c ≈ 3.6
for the demo pair on this CPU at M = 32, docs/results.md §1c) and yields A + 1 tokens, so it beats plain
decoding only while A > c - 1. Where the draft is out of its depth (answers longer than it
was trained on, a teacher past its training context) A can stay near 0 and every step loses. The gate
keeps an exponential moving average of accept_L over speculative steps,

    ema <- A                            (first speculative step)
    ema <- alpha * A + (1 - alpha) * ema

and when ``ema < min_accept`` the loop takes ``fallback_steps`` teacher-only steps (N = 1, the baseline's
own decode), then probes with one speculative step: a good probe lifts the average back over the bar and
drafting resumes, a bad one starts another fallback period. ``min_accept = 0`` never falls back (the
average is never negative). Output is unaffected either way: both kinds of step are exact greedy.

Worked example (min_accept 2, fallback_steps 3, alpha 0.5): A = 1 -> ema 1 < 2: 3 teacher-only steps;
probe A = 6 -> ema 3.5: speculate; A = 0 -> ema 1.75 < 2: 3 teacher-only steps; probe ...

Choose ``min_accept`` from a run's stage breakdown: c = (draft + verify + observe ms per step) / (baseline
ms per token); min_accept = c - 1.
"""
from __future__ import annotations

from eagle_ms.config import check_fallback

ALPHA = 0.5  # weight of the newest accept_L in the moving average


class SpeculationGate:
    """Per-generation state of the fallback rule (module doc). ``min_accept = 0``: always speculate."""

    def __init__(self, min_accept: float = 0.0, fallback_steps: int = 16):
        check_fallback(min_accept, fallback_steps)
        self.min_accept = float(min_accept)
        self.fallback_steps = fallback_steps
        self.average: float | None = None
        self.remaining = 0  # teacher-only steps left in the current fallback period

    def speculate(self) -> bool:
        """Whether the next step should draft (True) or be a teacher-only step (False)."""
        return self.remaining == 0

    def record(self, accepted_len: int | None) -> None:
        """After a step: its accept_L if it drafted, None for a teacher-only step."""
        if accepted_len is None:
            self.remaining = max(self.remaining - 1, 0)
            return
        a = float(accepted_len)
        self.average = a if self.average is None else ALPHA * a + (1.0 - ALPHA) * self.average
        if self.average < self.min_accept:
            self.remaining = self.fallback_steps
