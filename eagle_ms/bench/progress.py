"""A dependency-free progress line with ETA on stderr.

On a terminal the line is redrawn in place (``\\r``); otherwise (logs, msrun worker logs) one line is
printed per update. ETA = elapsed / done * remaining, over turns (turns differ in length, so it is a
rough guide early in a run).

Example line: ``[rank 0] 12/240   5.0%  mt_bench-86-2  speedup 1.31x  elapsed 1m02s  ETA 19m40s``
"""
from __future__ import annotations

import sys
import time


def format_seconds(seconds: float) -> str:
    """61 -> '1m01s', 3725 -> '1h02m05s', 4.2 -> '4s'."""
    s = int(round(max(seconds, 0.0)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    return f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    def __init__(self, total: int, label: str = "", stream=None, enabled: bool = True):
        self.total = total
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.done = 0
        self.start = time.monotonic()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def restart(self) -> None:
        """Reset the clock (e.g. after a warm-up that should not count in the ETA)."""
        self.start = time.monotonic()

    def eta_s(self) -> float | None:
        if self.done == 0:
            return None
        elapsed = time.monotonic() - self.start
        return elapsed / self.done * (self.total - self.done)

    def line(self, current: str = "", note: str = "") -> str:
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta = self.eta_s()
        parts = [f"{self.label}{self.done}/{self.total}", f"{pct:5.1f}%", current, note,
                 f"elapsed {format_seconds(time.monotonic() - self.start)}",
                 f"ETA {format_seconds(eta) if eta is not None else '?'}"]
        return "  ".join(p for p in parts if p)

    def update(self, current: str = "", note: str = "") -> None:
        """Count one finished item and redraw."""
        self.done += 1
        if not self.enabled:
            return
        text = self.line(current, note)
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if self.done >= self.total else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
