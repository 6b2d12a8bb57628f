"""PNG plots of a run (and of a sweep) from its summary dict; matplotlib with the Agg backend.

Run plots (``<run>/plots/``): speedup_hist.png (per-turn speedup, the paper's Fig. 2a),
speedup_vs_accept.png (per-turn speedup vs mean accept_L, Fig. 2b), accept_pos.png (Fig. 3),
stages.png (mean ms and p99/mean per stage, Fig. 5). Sweep plots: sweep_<name>.png (Fig. 4 / Fig. 6).
"""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from eagle_ms.files import atomic_write  # noqa: E402


def _save(fig, path: str) -> str:
    """The figure as a PNG at ``path``, written atomically (a failed save leaves no partial file)."""
    fig.tight_layout()
    try:
        atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=100), binary=True)
    finally:
        plt.close(fig)
    return path


def _ok_turns(summary: dict) -> list[dict]:
    return [t for t in summary["per_turn"] if t["status"] == "ok" and t["speedup"] is not None]


def speedup_hist(summary: dict, path: str) -> str:
    sp = [t["speedup"] for t in _ok_turns(summary)]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.hist(sp, bins=min(30, max(5, len(sp) // 4)) if sp else 5, color="#4477aa", edgecolor="white")
    ax.axvline(1.0, color="grey", linestyle="--", label="1x (baseline)")
    mean = summary["table1"]["speedup"]["mean"]
    if mean is not None:
        ax.axvline(mean, color="#cc3311", label=f"mean {mean:.2f}x")
    ax.set_xlabel("per-turn speedup (EA tok/s / baseline tok/s)")
    ax.set_ylabel("turns")
    ax.legend()
    return _save(fig, path)


def speedup_vs_accept(summary: dict, path: str) -> str:
    fig, ax = plt.subplots(figsize=(6, 4))
    turns = _ok_turns(summary)
    for ds in dict.fromkeys(t["dataset"] for t in turns):
        pts = [(t["mean_accept_L"], t["speedup"]) for t in turns if t["dataset"] == ds and t["mean_accept_L"] is not None]
        if pts:
            ax.scatter(*zip(*pts), s=14, label=ds, alpha=0.8)
    ax.axhline(1.0, color="grey", linestyle="--")
    ax.set_xlabel("mean accept_L of the turn")
    ax.set_ylabel("speedup")
    if turns:
        ax.legend()
    return _save(fig, path)


def accept_pos(summary: dict, path: str) -> str:
    pos = [(a["depth"], a["share"]) for a in summary["accept_pos"] if a["share"] is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    if pos:
        ax.bar(*zip(*pos), color="#228833")
    ax.set_xlabel("draft depth d")
    ax.set_ylabel("share of verify steps reaching d")
    ax.set_ylim(0, 1)
    return _save(fig, path)


def stage_bars(summary: dict, path: str) -> str:
    stages = summary["stages"]
    names = list(stages)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.bar(names, [stages[n]["mean_ms"] for n in names], color="#4477aa")
    a1.set_ylabel("mean ms")
    a1.set_title("prefill, other: per turn; the rest: per verify step", fontsize=9)
    a2.bar(names, [stages[n]["p99_over_mean"] or 0 for n in names], color="#ee7733")
    a2.set_ylabel("p99 / mean")
    for ax in (a1, a2):
        ax.tick_params(axis="x", rotation=45)
    return _save(fig, path)


def plot_run(summary: dict, folder: str) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    return [speedup_hist(summary, os.path.join(folder, "speedup_hist.png")),
            speedup_vs_accept(summary, os.path.join(folder, "speedup_vs_accept.png")),
            accept_pos(summary, os.path.join(folder, "accept_pos.png")),
            stage_bars(summary, os.path.join(folder, "stages.png"))]


def sweep_curve(name: str, axis: str, rows: list[dict], path: str) -> str:
    """1-D sweep: speedup (mean, p50) and mean accept_L against the swept value; 2-D: speedup heatmap."""
    if axis == "grid":
        budgets = sorted({r["budget"] for r in rows})
        depths = sorted({r["max_depth"] for r in rows})
        grid = [[next((r["speedup_mean"] for r in rows if r["budget"] == m and r["max_depth"] == d), None) or 0.0
                 for d in depths] for m in budgets]
        fig, ax = plt.subplots(figsize=(6, 4))
        im = ax.imshow(grid, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(depths)), [str(d) for d in depths])
        ax.set_yticks(range(len(budgets)), [str(m) for m in budgets])
        ax.set_xlabel("Dmax")
        ax.set_ylabel("M")
        fig.colorbar(im, label="mean speedup")
        return _save(fig, path)
    labels = [str(r[axis]) if r[axis] is not None else "none" for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.plot(labels, [r["speedup_mean"] or 0 for r in rows], marker="o", label="mean")
    a1.plot(labels, [r["speedup_p50"] or 0 for r in rows], marker="s", label="p50")
    a1.axhline(1.0, color="grey", linestyle="--")
    a1.set_ylabel("speedup")
    a1.legend()
    a2.plot(labels, [r["accept_L_mean"] or 0 for r in rows], marker="o", color="#228833")
    a2.set_ylabel("mean accept_L")
    for ax in (a1, a2):
        ax.set_xlabel(axis)
    fig.suptitle(f"sweep {name}")
    return _save(fig, path)
