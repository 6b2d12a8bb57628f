"""``--profile``: the tree-mask share of each verify step, for explanation runs, never for headline numbers.

Every run already records per verify step the stages the generation loop laps with
``time.perf_counter`` (draft, tensorize, mask, verify, accept, commit, observe; ``StepRecord.stage_s``).
That costs ~8 clock reads per step (well under a microsecond, against steps of milliseconds), so it
stays on in headline runs (docs/metrics.md gives the measurement). The ``mask`` stage there is the
[N, S] verify mask (``tree.verify_attention_mask``), which the loop builds in a lap of its own.

The [N, N] tree mask is built inside ``tensorize`` (and again by the reference-mode invariant check),
so the plain stage split counts it as tensorize. A profile run wraps the function that builds it,
``tree_mask``, where it is looked up (eagle_ms/tree.py for ``tensorize``, eagle_ms/tree_checks.py for the
check) with a timer, for the duration of the speculative run only (a wrapper per call perturbs timing
a little, hence a separate flag; the library is not edited). The loop's ``on_step`` hook marks the end
of each verify step, so the tree-mask calls since the previous step belong to the current one.

Per step the trace then carries ``profile_s = {"mask_tree_s", "mask_verify_s"}`` (the second is the
loop's own ``mask`` lap), and the summary moves ``mask_tree_s`` from tensorize into ``mask``. Every step
builds at least one tree mask (a teacher-only step tensorizes the root alone), so a step without one
means the wrapper no longer sees the builder: ``per_step`` then returns None and the bench warns.
"""
from __future__ import annotations

import contextlib
import time

import eagle_ms.tree as _tree
import eagle_ms.tree_checks as _tree_checks

_PATCHED = (_tree, _tree_checks)  # every module that calls tree_mask by its own global name


class MaskProfiler:
    """Times every tree-mask construction while ``active()``; ``on_step`` closes a verify step."""

    def __init__(self):
        self._open: list[float] = []  # tree-mask seconds of the step in progress
        self._steps: list[dict] = []

    def _timed(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._open.append(time.perf_counter() - t0)
        return timed

    def on_step(self, record) -> None:
        """The loop's ``DecodeSettings.on_step`` hook: file the tree masks since the last step."""
        self._steps.append({"calls": len(self._open), "mask_tree_s": sum(self._open),
                            "mask_verify_s": record.stage_s.get("mask", 0.0)})
        self._open = []

    @contextlib.contextmanager
    def active(self):
        """Time tree-mask construction inside the ``with`` block; restores the original functions."""
        self._open, self._steps = [], []
        originals = [module.tree_mask for module in _PATCHED]
        for module, fn in zip(_PATCHED, originals):
            module.tree_mask = self._timed(fn)
        try:
            yield self
        finally:
            for module, fn in zip(_PATCHED, originals):
                module.tree_mask = fn

    def per_step(self, n_steps: int) -> list[dict] | None:
        """[{"mask_tree_s", "mask_verify_s"}] per verify step; None if the events do not line up."""
        if len(self._steps) != n_steps or any(s["calls"] == 0 for s in self._steps):
            return None
        return [{"mask_tree_s": s["mask_tree_s"], "mask_verify_s": s["mask_verify_s"]} for s in self._steps]


class NullProfiler:
    """The headline-run stand-in: no wrapping, no events."""

    on_step = None  # no hook: the loop calls nothing extra

    @contextlib.contextmanager
    def active(self):
        yield self

    def per_step(self, n_steps: int) -> None:
        return None
