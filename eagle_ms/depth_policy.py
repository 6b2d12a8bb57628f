"""Adaptive tree depth (``speculative.shallow_depth``): a shallow tree after a step that accepted little.

Acceptance runs in streaks: on the demo pair a step that accepted fewer than 4 drafts is followed by one
that accepts 2.5 on average, against 7.8 after a step that accepted 7 or more (docs/results.md §1o). Every
tree depth is one more dependent draft call, and every node one more verify row, so a tree deeper and
wider than the next step will use is paid for and thrown away. With ``shallow_depth`` Ds, the step after
a drafted step that accepted fewer than Ds drafts drafts ``TreeParams.shallow(Ds)``: depth <= Ds and
every candidate of those depths (budget min(M, k + (Ds-1) k^2)); a step after one that accepted Ds or
more, and the first step of a generation, drafts the full tree. A shallow step that accepts all of its
Ds drafts therefore switches back. Teacher-only steps (fallback, capacity) leave the choice unchanged.

The tree changes, never the output: every tree is verified exactly (eagle_ms/generate.py), and the
host sees only the accepted count it already reads, so the policy costs no device read.
Example (Ds 4): accepted 9, 2, 1, 4, 6 -> trees full, full, shallow, shallow, full, full.
"""
from __future__ import annotations

from eagle_ms.drafting import TreeParams


class DepthPolicy:
    """The tree of each drafted step (module doc). ``shallow``: ``TreeParams.shallow(Ds)``, or None (always
    the drafter's own tree)."""

    def __init__(self, shallow: TreeParams | None):
        self.shallow = shallow
        self.last_accepted: int | None = None  # A of the last drafted step; None before the first

    def tree(self) -> TreeParams | None:
        """The next drafted step's tree: the shallow params, or None for the drafter's own."""
        if self.shallow is None or self.last_accepted is None:
            return None
        return self.shallow if self.last_accepted < self.shallow.max_depth else None

    def record(self, accepted_len: int | None) -> None:
        """After a step: its accepted drafts A, or None for a teacher-only step (no change)."""
        if accepted_len is not None:
            self.last_accepted = accepted_len
