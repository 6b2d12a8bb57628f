"""Low-acceptance fallback: when drafting stops paying, take teacher-only steps for a while.

A speculative step costs c teacher decode steps (draft + verify of N = M + 1 nodes + observe) and yields
A + 1 tokens, so it beats plain decoding only while A > c - 1. Where the draft is out of its depth
(answers longer than it was trained on, a teacher past its training context) A can stay near 0 and
every step loses. The gate keeps an exponential moving average of accept_L over speculative steps,

    ema <- A                            (first speculative step)
    ema <- alpha * A + (1 - alpha) * ema

and when ``ema < min_accept`` the loop takes ``fallback_steps`` teacher-only steps (N = 1, the baseline's
own decode), then probes with one speculative step: a good probe lifts the average back over the bar and
drafting resumes, a bad one starts another fallback period. ``min_accept = 0`` never falls back (the
average is never negative). Output is unaffected either way: both kinds of step are exact greedy.

Worked example (min_accept 2, fallback_steps 3, alpha 0.5): A = 1 -> ema 1 < 2: 3 teacher-only steps;
probe A = 6 -> ema 3.5: speculate; A = 0 -> ema 1.75 < 2: 3 teacher-only steps; probe ...

The bar itself (``speculative.fallback_accept: auto``, ``StepCosts``) is c - 1 with c measured: the loop
times every step, and c is the moving average of speculative step seconds over that of teacher-only step
seconds. It follows the machine, the budget and the context length (both step kinds slow down as the
attention window grows) without a hand-set number.
"""
from __future__ import annotations

from eagle_ms.config import FALLBACK_AUTO, check_fallback

ALPHA = 0.5  # weight of the newest accept_L in the moving average
COST_ALPHA = 0.1  # weight of the newest step's seconds in StepCosts' moving averages


class StepCosts:
    """Measured step costs and the accept_L at which drafting breaks even (module doc).

    ``record`` takes every step's wall time as the loop measured it (draft, verify, commit and observe
    included). ``break_even`` = t_spec / t_dec - 1, where t_spec and t_dec are moving averages (weight
    ``COST_ALPHA`` on the newest step) of speculative and teacher-only step seconds; None until both kinds
    have been seen. One instance lives in a Session's decode settings, so the costs carry over from
    generation to generation (the benchmark's warm-up pair and baseline runs measure t_dec).
    """

    def __init__(self):
        self.seconds: dict[str, float | None] = {"speculative": None, "decode": None}  # the moving averages
        self.counts = {"speculative": 0, "decode": 0}

    def record(self, drafted: bool, seconds: float) -> None:
        kind = "speculative" if drafted else "decode"
        old = self.seconds[kind]
        self.seconds[kind] = seconds if old is None else COST_ALPHA * seconds + (1.0 - COST_ALPHA) * old
        self.counts[kind] += 1

    @property
    def break_even(self) -> float | None:
        """The accept_L below which a speculative step yields fewer tokens per second than decoding."""
        spec, dec = self.seconds["speculative"], self.seconds["decode"]
        if spec is None or not dec:
            return None
        return max(spec / dec - 1.0, 0.0)


class SpeculationGate:
    """Per-generation state of the fallback rule (module doc). ``min_accept = 0``: always speculate;
    ``min_accept = "auto"``: the bar is ``costs.break_even`` at each decision (0 while it is unknown)."""

    def __init__(self, min_accept: float | str = 0.0, fallback_steps: int = 16, costs: StepCosts | None = None):
        check_fallback(min_accept, fallback_steps)
        if min_accept == FALLBACK_AUTO and costs is None:
            raise ValueError("speculative.fallback_accept is 'auto' but no StepCosts was given to measure it")
        self.costs = costs if min_accept == FALLBACK_AUTO else None
        self._fixed = 0.0 if min_accept == FALLBACK_AUTO else float(min_accept)
        self.fallback_steps = fallback_steps
        self.average: float | None = None
        self.remaining = 0  # teacher-only steps left in the current fallback period

    @property
    def min_accept(self) -> float:
        """The bar the average is compared with now."""
        if self.costs is None:
            return self._fixed
        bar = self.costs.break_even
        return 0.0 if bar is None else bar

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
