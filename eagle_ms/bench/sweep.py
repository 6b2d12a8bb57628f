"""``eagle-ms sweep``: the budget/depth sweep (Table 2, any 2-D grid) and the draft-window ablation (Table 3).

Every grid point is a complete bench run (both baseline and EA per turn, so each point's speedups are
paired) in ``<sweep>/points/<point>/``, with its own manifest, traces and summary; points shared by two
sweeps run once. ``<sweep>/sweep.json`` holds the plan and, per sweep, one row per point;
``sweep.md`` one table per sweep; ``plots/sweep_<name>.png`` the curves. ``eagle-ms report <sweep>``
rebuilds everything from the points' traces.

Each point runs in its own child process (``multiprocessing`` spawn), which builds its Session (the
teacher's commit width depends on Dmax and the verify graph on M), runs the point and exits: a point costs
one process start, teacher build and compile. When the points ran one after another in one process, the
earlier points' graphs stayed resident and every later point decoded slower (a 4-point sweep of
the demo pair: baseline 127, 116, 78, 67 tokens/s; 121-135 for the same points run alone), which skewed
the speedups of the later points (docs/results.md §2).

Plans (``plan_sweeps``):
  --preset table2         M in {16,32,64,128,256} at Dmax=10, and Dmax in {4,8,10,12,16} at M=64
  --preset table3         draft window in {none,128,256,512} at the config's M and Dmax
  --budgets/--depths      a 1-D sweep (one list has several values) or the full 2-D grid (both do)
  --windows               a window sweep at the config's M and Dmax
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import sys
import traceback
from dataclasses import dataclass

from eagle_ms import trace
from eagle_ms.bench.summary import fmt, md_table, write_report
from eagle_ms.files import atomic_write
from eagle_ms.locks import lock_dir

TABLE2_BUDGETS = (16, 32, 64, 128, 256)
TABLE2_DEPTHS = (4, 8, 10, 12, 16)
TABLE3_WINDOWS = (None, 128, 256, 512)
SWEEP_FILE = "sweep.json"


@dataclass(frozen=True)
class SweepPoint:
    budget: int
    max_depth: int
    draft_window: int | None = None

    @property
    def name(self) -> str:
        return f"M{self.budget}-D{self.max_depth}-W{self.draft_window or 'none'}"


@dataclass(frozen=True)
class Sweep:
    name: str
    axis: str  # budget | max_depth | draft_window | grid
    points: tuple[SweepPoint, ...]


def parse_int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{flag} {text!r}: expected positive integers")
    return values


def parse_windows(text: str) -> tuple[int | None, ...]:
    """``"none,128,256"`` -> (None, 128, 256)."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if item.lower() in ("none", "full"):
            out.append(None)
        elif item:
            out.extend(parse_int_list(item, "--windows"))
    if not out:
        raise ValueError(f"--windows {text!r}: no values")
    return tuple(out)


def plan_sweeps(budget: int, max_depth: int, budgets=None, depths=None, windows=None,
                preset: str | None = None) -> list[Sweep]:
    """The sweeps to run; ``budget``/``max_depth`` are the config's values (the fixed ones)."""
    sweeps: list[Sweep] = []
    if preset == "table2":
        sweeps.append(Sweep("budget", "budget", tuple(SweepPoint(m, 10) for m in TABLE2_BUDGETS)))
        sweeps.append(Sweep("max_depth", "max_depth", tuple(SweepPoint(64, d) for d in TABLE2_DEPTHS)))
    elif preset == "table3":
        sweeps.append(Sweep("draft_window", "draft_window",
                            tuple(SweepPoint(budget, max_depth, w) for w in TABLE3_WINDOWS)))
    elif preset is not None:
        raise ValueError(f"--preset {preset!r}: known presets are table2, table3")
    if budgets or depths:
        bs, ds = tuple(budgets or (budget,)), tuple(depths or (max_depth,))
        if len(bs) > 1 and len(ds) > 1:
            sweeps.append(Sweep("grid", "grid", tuple(SweepPoint(m, d) for m in bs for d in ds)))
        elif len(ds) > 1:
            sweeps.append(Sweep("max_depth", "max_depth", tuple(SweepPoint(bs[0], d) for d in ds)))
        else:
            sweeps.append(Sweep("budget", "budget", tuple(SweepPoint(m, ds[0]) for m in bs)))
    if windows:
        sweeps.append(Sweep("draft_window", "draft_window", tuple(SweepPoint(budget, max_depth, w) for w in windows)))
    if not sweeps:
        raise ValueError("nothing to sweep: give --budgets, --depths, --windows or --preset")
    names = [s.name for s in sweeps]
    for i, s in enumerate(sweeps):  # two sweeps along one axis keep distinct names
        if names.count(s.name) > 1:
            sweeps[i] = dataclasses.replace(s, name=f"{s.name}_{names[:i + 1].count(s.name)}")
    return sweeps


def unique_points(sweeps: list[Sweep]) -> list[SweepPoint]:
    return list(dict.fromkeys(p for s in sweeps for p in s.points))


def point_dir(sweep_dir: str, point: SweepPoint) -> str:
    return os.path.join(sweep_dir, "points", point.name)


def run_sweep(cfg, sweeps: list[Sweep], opts, command: str | None = None) -> dict | None:
    """Run every point (a bench run each) and, on rank 0, write the sweep tables; returns them.

    This rank holds its lock on the sweep directory throughout (eagle_ms/locks.py), and each point's
    run its lock on the point directory: a second sweep into the same directory is refused.
    """
    from eagle_ms.bench.distributed import job_id

    sweep_dir = opts.out
    points = unique_points(sweeps)
    configs = {p: cfg.replace("speculative", budget=p.budget, max_depth=p.max_depth, draft_window=p.draft_window)
               for p in points}  # validate every point before running any
    with lock_dir(sweep_dir, opts.rank, opts.world_size, job_id()):
        if opts.rank == 0:
            trace.write_json(os.path.join(sweep_dir, SWEEP_FILE), {"kind": "sweep", "command": command,
                                                                    "plan": _plan_dict(sweeps), "results": None})
        for i, p in enumerate(points):
            if opts.progress:
                print(f"sweep point {i + 1}/{len(points)}: {p.name}", file=sys.stderr, flush=True)
            _run_point_process(p, configs[p], dataclasses.replace(opts, out=point_dir(sweep_dir, p), command=command))
        return write_sweep_report(sweep_dir) if opts.rank == 0 else None


def _run_point_process(point: SweepPoint, cfg, opts) -> None:
    """Run one point's bench in a fresh child process; its error is raised here, as if raised in-process.

    A child that dies without reporting (killed, out of memory) is a RuntimeError naming the point: its
    finished turns are on disk and ``--resume`` continues the sweep.
    """
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_point_child, args=(send, cfg, opts), name=f"sweep-{point.name}")
    child.start()
    send.close()
    try:
        error = receive.recv()
    except EOFError:  # the child ended without a word
        error = None
    child.join()
    if error is not None:
        raise error
    if child.exitcode != 0:
        raise RuntimeError(f"sweep point {point.name}: its process ended with exit code {child.exitcode} "
                           f"before finishing; its finished turns are kept in {opts.out}: rerun with --resume")


def _point_child(send, cfg, opts) -> None:
    """Child process body: set up MindSpore, run the point, report ``None`` or the exception raised."""
    from eagle_ms.bench.runner import run_bench
    from eagle_ms.runtime import setup_context

    try:
        setup_context(cfg)
        run_bench(cfg, opts)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent, which re-raises it
        if not isinstance(exc, (ValueError, OSError, KeyboardInterrupt)):  # the CLI reports those by message;
            traceback.print_exc()                                          # anything else keeps its traceback
        try:
            send.send(exc)
        except Exception:  # noqa: BLE001 - an exception that does not pickle goes back as its text
            send.send(RuntimeError(f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None
    send.send(None)


def _plan_dict(sweeps: list[Sweep]) -> list[dict]:
    return [{"name": s.name, "axis": s.axis, "points": [dataclasses.asdict(p) | {"name": p.name} for p in s.points]}
            for s in sweeps]


def _row(sweep_dir: str, p: dict, regenerate: bool) -> dict:
    folder = os.path.join(sweep_dir, "points", p["name"])
    row = {k: p[k] for k in ("name", "budget", "max_depth", "draft_window")}
    try:
        s = write_report(folder) if regenerate else trace.read_json(os.path.join(folder, "summary.json"))
    except (OSError, ValueError) as exc:
        return row | {"error": str(exc)}
    t1 = s["table1"]
    return row | {"turns_ok": s["turns"]["ok"], "baseline_tokens_per_s": t1["baseline_tokens_per_s"]["mean"],
                  "ea_tokens_per_s": t1["ea_tokens_per_s"]["mean"], "speedup_mean": t1["speedup"]["mean"],
                  "speedup_p50": t1["speedup"]["p50"], "accept_L_mean": t1["accept_L"]["mean"],
                  "accept_L_p90": t1["accept_L"]["p90"], "tau": s["tau"], "exactness": s["exactness"]["share"]}


def write_sweep_report(sweep_dir: str, regenerate_points: bool = True) -> dict:
    """Rebuild every point's summary from its traces, then sweep.json results, sweep.md and the curves."""
    from eagle_ms.bench.plots import sweep_curve

    data = trace.read_json(os.path.join(sweep_dir, SWEEP_FILE))
    done: dict[str, dict] = {}
    results = []
    for s in data["plan"]:
        rows = []
        for p in s["points"]:
            if p["name"] not in done:
                done[p["name"]] = _row(sweep_dir, p, regenerate_points)
            rows.append(done[p["name"]])
        results.append({"name": s["name"], "axis": s["axis"], "rows": rows})
    data["results"] = results
    trace.write_json(os.path.join(sweep_dir, SWEEP_FILE), data)
    atomic_write(os.path.join(sweep_dir, "sweep.md"), lambda fh: fh.write(render_sweep_markdown(data)))
    os.makedirs(os.path.join(sweep_dir, "plots"), exist_ok=True)
    for r in results:
        good = [row for row in r["rows"] if "error" not in row]
        if good:
            sweep_curve(r["name"], r["axis"], good, os.path.join(sweep_dir, "plots", f"sweep_{r['name']}.png"))
    return data


def render_sweep_markdown(data: dict) -> str:
    lines = ["# Sweep summary", ""]
    if data.get("command"):
        lines += ["Command:", "", "```", data["command"], "```", ""]
    for r in data["results"]:
        lines += [f"## Sweep `{r['name']}` (axis {r['axis']})", ""]
        lines += md_table(["point", "M", "Dmax", "window", "turns", "baseline tok/s", "EA tok/s", "speedup mean",
                         "speedup p50", "accept_L mean", "accept_L p90", "tau", "exactness"],
                        [[row["name"], str(row["budget"]), str(row["max_depth"]), str(row["draft_window"] or "none")]
                         + ([f"error: {row['error']}"] + [""] * 8 if "error" in row else
                            [str(row["turns_ok"]), fmt(row["baseline_tokens_per_s"]), fmt(row["ea_tokens_per_s"]),
                             fmt(row["speedup_mean"], 2, "x"), fmt(row["speedup_p50"], 2, "x"),
                             fmt(row["accept_L_mean"]), fmt(row["accept_L_p90"]), fmt(row["tau"]),
                             fmt(row["exactness"], 3)])
                         for row in r["rows"]])
        if r["axis"] == "grid":
            lines += ["", "Mean speedup, rows M, columns Dmax:", ""] + _grid_table(r["rows"])
        lines.append("")
    return "\n".join(lines)


def _grid_table(rows: list[dict]) -> list[str]:
    budgets = sorted({r["budget"] for r in rows})
    depths = sorted({r["max_depth"] for r in rows})
    cell = {(r["budget"], r["max_depth"]): r.get("speedup_mean") for r in rows}
    return md_table(["M \\ Dmax"] + [str(d) for d in depths],
                  [[str(m)] + [fmt(cell.get((m, d)), 2, "x") for d in depths] for m in budgets])
