"""``--profile``: a finer stage split for explanation runs, never for headline numbers.

Every run already records per verify step the stages the generation loop laps with
``time.perf_counter`` (draft, tensorize, verify, accept, commit, observe; ``StepRecord.stage_s``).
That costs ~7 clock reads per step (well under a microsecond, against steps of milliseconds), so it
stays on in headline runs (docs/metrics.md gives the measurement).

Mask construction happens inside two of those stages: the [N, N] tree mask inside ``tensorize`` (and
again in the reference-mode invariant check) and the [N, S_max] verify mask inside the teacher's
``verify``. A profile run times those calls separately so the breakdown can show a ``mask`` stage, as
the paper's Fig. 5 does. It does so by wrapping ``eagle_ms.tree._tree_mask`` and
``eagle_ms.teacher.verify_attention_mask`` with timers for the duration of the speculative run only
(a wrapper per call perturbs timing a little, hence a separate flag; the library is not edited).

Attribution to steps: each verify step calls the verify mask exactly once, after its tree masks, so
the tree-mask calls since the previous verify-mask call belong to the current step.
"""
from __future__ import annotations

import contextlib
import time

import eagle_ms.teacher as _teacher
import eagle_ms.tree as _tree


class MaskProfiler:
    """Records (kind, seconds) for every mask construction while ``active()``."""

    def __init__(self):
        self.events: list[tuple[str, float]] = []

    def _wrap(self, kind: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.events.append((kind, time.perf_counter() - t0))
        return timed

    @contextlib.contextmanager
    def active(self):
        """Time mask construction inside the ``with`` block; restores the original functions."""
        self.events = []
        tree_fn, verify_fn = _tree._tree_mask, _teacher.verify_attention_mask
        _tree._tree_mask = self._wrap("tree", tree_fn)
        _teacher.verify_attention_mask = self._wrap("verify", verify_fn)
        try:
            yield self
        finally:
            _tree._tree_mask, _teacher.verify_attention_mask = tree_fn, verify_fn

    def per_step(self, n_steps: int) -> list[dict] | None:
        """[{"mask_tree_s", "mask_verify_s"}] per verify step; None if the events do not line up."""
        out, tree_s = [], 0.0
        for kind, dt in self.events:
            if kind == "tree":
                tree_s += dt
            else:
                out.append({"mask_tree_s": tree_s, "mask_verify_s": dt})
                tree_s = 0.0
        return out if len(out) == n_steps else None


class NullProfiler:
    """The headline-run stand-in: no wrapping, no events."""

    @contextlib.contextmanager
    def active(self):
        yield self

    def per_step(self, n_steps: int) -> None:
        return None
