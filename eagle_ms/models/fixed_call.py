"""FixedSignatureCall: a graph called with one input signature for its whole life, by MindSpore's predict path.

Every call of a graph Cell in GRAPH_MODE goes through ``Cell.compile`` before it runs: MindSpore builds the
arguments' cache key, inspects ``construct``'s signature and looks the compiled graph up. On this CPU that
host work costs about 0.5 ms per decode call and 0.8 ms per fused draft + verify call, holding the GIL
(docs/teacher_profile.md §"The per-call compile check"). MindSpore skips it for a Cell whose ``phase`` is
'increment' once that phase is compiled (``Cell._predict``, the path MindFormers' incremental inference
uses): the call goes straight to the compiled graph.

The per-step graphs are built for one set of shapes (the decode and verify steps, one per attention window
and, for the verify, per tree size N; the draft tree step; the fused step; the cache mover) and take this
mixin. It keeps the check the fast path drops: the first call fixes the signature (each
argument's shape and dtype) and compiles; a later call with another signature raises ValueError naming the
argument instead of running a graph compiled for other shapes.
"""
from __future__ import annotations

PREDICT_PHASE = "increment"  # the phase name MindSpore's Cell._predict serves from its compiled-phase cache


def signature_of(args) -> tuple:
    """((shape, dtype) per argument): what a fixed-shape graph's compiled form depends on."""
    return tuple((tuple(a.shape), a.dtype) for a in args)


class FixedSignatureCall:
    """Mixin for an ``nn.Cell`` subclass (listed before it in the bases): the Cell is compiled once, for the
    signature of its first call, and later calls skip MindSpore's per-call compile check (module doc).
    Positional Tensor arguments only."""

    fixed_signature = None

    def __call__(self, *args):
        signature = signature_of(args)
        if self.fixed_signature is None:
            self.phase = PREDICT_PHASE  # compiled under this phase by the call below, then served from it
            self.fixed_signature = signature
        elif signature != self.fixed_signature:
            raise ValueError(f"{type(self).__name__} is compiled for one input signature: "
                             f"{signature_difference(signature, self.fixed_signature)}")
        return super().__call__(*args)


def signature_difference(got: tuple, want: tuple) -> str:
    """Which argument of ``got`` differs from the compiled signature ``want``, in words."""
    if len(got) != len(want):
        return f"{len(got)} arguments, compiled for {len(want)}"
    i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
    return f"argument {i} has shape/dtype {got[i]}, compiled for {want[i]}"
