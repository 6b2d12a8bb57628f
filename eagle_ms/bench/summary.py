"""summary.json / summary.md of a run directory, computed from its traces only.

``write_report(run_dir)`` is what the bench calls at the end and what ``eagle-ms report RUN_DIR`` calls
later, so a report regenerated from traces equals the one written by the run (no timestamps inside).
Turns that failed or were skipped are listed and left out of every statistic. Metric definitions:
``eagle_ms.bench.metrics`` (and docs/metrics.md).
"""
from __future__ import annotations

import os

import numpy as np

from eagle_ms import trace
from eagle_ms import metrics
from eagle_ms.bench.turn import TWO_CALLS
from eagle_ms.files import atomic_write

STEP_STAGES = ("draft", "tensorize", "mask", "verify", "draft_verify", "accept", "commit", "observe")


def _mean(values):
    return float(np.mean(values)) if len(values) else None


def _per_turn(h: dict, steps: list[dict]) -> dict:
    acc = [s["accepted_len"] for s in steps]
    return {"key": h["key"], "dataset": h["dataset"], "status": h["status"], "exact": h["exact"],
            "speedup": h["speedup"],
            "baseline_tokens_per_s": (h["baseline"] or {}).get("tokens_per_s"),
            "ea_tokens_per_s": (h["ea"] or {}).get("tokens_per_s"),
            "n_tokens": (h["ea"] or h["baseline"] or {}).get("n_tokens"),
            "prompt_tokens": h["prompt_tokens"], "verify_steps": len(steps),
            "tau": metrics.tau(acc), "mean_accept_L": _mean(acc)}


def _stage_samples(ok: list[tuple[dict, list[dict]]]) -> dict:
    """Per-step stage seconds of every EA verify step; ``prefill``/``other`` per turn.

    ``other`` = EA wall time - prefill - all step stages (drafter.begin, loop overhead). ``mask`` is the
    verify mask (its own lap in every run); in profile runs the tree-mask time is moved out of tensorize
    into ``mask`` too (eagle_ms/bench/profile.py).
    """
    samples: dict[str, list[float]] = {name: [] for name in ("prefill",) + STEP_STAGES + ("other",)}
    for h, steps in ok:
        ea = h["ea"]
        samples["prefill"].append(ea["prefill_s"])
        in_steps = 0.0
        for s in steps:
            st = dict(s["stage_s"])
            prof = s.get("profile_s")
            if prof:
                st["tensorize"] = st.get("tensorize", 0.0) - prof["mask_tree_s"]
                st["mask"] = st.get("mask", 0.0) + prof["mask_tree_s"]
            for name, value in st.items():
                samples.setdefault(name, []).append(value)
            in_steps += sum(s["stage_s"].values())
        samples["other"].append(ea["total_s"] - ea["prefill_s"] - in_steps)
    return {k: v for k, v in samples.items() if v}


def _decode_seconds(ok) -> list[float]:
    """Baseline decode seconds per token of each turn (wall time minus prefill, over the later tokens)."""
    return [(h["baseline"]["total_s"] - h["baseline"]["prefill_s"]) / (h["baseline"]["n_tokens"] - 1)
            for h, _ in ok if h["baseline"]["n_tokens"] > 1]


def _step_costs(turns, timed: list[tuple[dict, float]], tau_drafted, speedup_mean) -> dict:
    """metrics.step_costs of ``turns``' baseline decodes and the drafted steps ``timed``: (stage seconds,
    t_ver) each, the overhead being the stages minus t_ver."""
    return metrics.step_costs(_decode_seconds(turns), [t_ver for _, t_ver in timed],
                              [sum(stages.values()) - t_ver for stages, t_ver in timed], tau_drafted, speedup_mean)


def _costs(ok, tau_drafted, speedup_mean) -> dict:
    """Step costs of the run's drafted steps. A fused step (stage ``draft_verify``: draft and verify in one
    graph call) has no verify time of its own; with ``--verify-apart`` (eagle_ms/bench/turn.py) it carries
    the two-call step's stages of the same step, whose ``verify`` is its t_ver. Steps with neither are left
    out (t_ver, overhead, bound and efficiency None if no step is left)."""
    timed = []
    for _, st in ok:
        for s in st:
            t_ver = s["stage_s"].get("verify", (s.get("two_calls_stage_s") or {}).get("verify"))
            if s["tree_nodes"] > 0 and t_ver is not None:
                timed.append((s["stage_s"], t_ver))
    return _step_costs(ok, timed, tau_drafted, speedup_mean)


def _two_calls(ok, tau_drafted) -> dict | None:
    """The --verify-apart runs against the fused runs of the same turns: how many gave the same tokens, the
    per-turn ratio fused tok/s / two-call tok/s, the two-call step's own speedup, step costs and mean stage
    ms over its drafted steps; None when the run has no --verify-apart records."""
    turns = [(h, st) for h, st in ok if h.get(TWO_CALLS)]
    if not turns:
        return None
    pairs = [(h["ea"], h["baseline"], h[TWO_CALLS]) for h, _ in turns]
    speedup = metrics.describe(v for v in (metrics.speedup(t["tokens_per_s"], b["tokens_per_s"]) for _, b, t in pairs)
                               if v is not None)
    timed = [(s["two_calls_stage_s"], s["two_calls_stage_s"]["verify"]) for _, st in turns for s in st
             if s["tree_nodes"] > 0 and "two_calls_stage_s" in s]
    return {"turns": len(turns), "same_tokens": int(sum(t["same_tokens"] for _, _, t in pairs)),
            "fused_over_two_calls": metrics.describe(e["tokens_per_s"] / t["tokens_per_s"]
                                                     for e, _, t in pairs if t["tokens_per_s"] > 0),
            "speedup": speedup, "costs": _step_costs(turns, timed, tau_drafted, speedup["mean"]),
            "stage_ms": {name: 1e3 * float(np.mean([st.get(name, 0.0) for st, _ in timed]))
                         for name in STEP_STAGES if any(name in st for st, _ in timed)}}


def _table1(ok, flat_accept) -> dict:
    return {"baseline_tokens_per_s": metrics.describe(h["baseline"]["tokens_per_s"] for h, _ in ok),
            "ea_tokens_per_s": metrics.describe(h["ea"]["tokens_per_s"] for h, _ in ok),
            "speedup": metrics.describe(h["speedup"] for h, _ in ok if h["speedup"] is not None),
            "accept_L": metrics.describe(flat_accept)}


def _group(ok, max_depth: int) -> dict:
    """Table 1, tau, accept_pos and exactness of a list of ok turns."""
    flat = [s["accepted_len"] for _, steps in ok for s in steps]
    t1 = _table1(ok, flat)
    base_mean, ea_mean = t1["baseline_tokens_per_s"]["mean"], t1["ea_tokens_per_s"]["mean"]
    identical = [bool(h["exact"]) for h, _ in ok]
    return {"turns": len(ok), "table1": t1,
            "speedup_of_means": ea_mean / base_mean if base_mean else None,
            "tau": metrics.tau(flat), "verify_steps": len(flat),
            "accept_pos": metrics.accept_pos(flat, max_depth),
            "exactness": metrics.exactness(identical), "identical": int(sum(identical))}


def _accept_by_position(ok) -> dict:
    """Acceptance per bucket of committed context length ("context": prompt + answer so far) and of
    answer offset ("answer": generated tokens so far, i.e. the same with a zero-length prompt)."""
    turns = [(h["prompt_tokens"], [s["accepted_len"] for s in st], [s["tree_nodes"] > 0 for s in st])
             for h, st in ok]
    return {"context": metrics.accept_by_position(turns, metrics.POSITION_BUCKET),
            "answer": metrics.accept_by_position([(0, acc, d) for _, acc, d in turns], metrics.POSITION_BUCKET)}


def summarize(run_dir: str) -> dict:
    """The summary dict of a run directory (see module docstring)."""
    man_path = os.path.join(run_dir, trace.MANIFEST)
    manifest = trace.read_json(man_path) if os.path.exists(man_path) else {}
    traces = trace.read_traces(run_dir)
    if not traces and not manifest:
        raise ValueError(f"{run_dir}: no manifest.json and no traces: not a bench run directory")
    ok = [(h, s) for h, s in traces if h["status"] == "ok"]
    run = dict(manifest.get("run", {}))
    max_depth = run.get("max_depth") or max([s["accepted_len"] for _, st in ok for s in st] + [1])
    world = manifest.get("world_size", 1)
    expected = [t["key"] for t in manifest.get("turns", [])]
    present = {h["key"] for h, _ in traces}
    overall = _group(ok, max_depth)
    tau_drafted = metrics.tau([s["accepted_len"] for _, st in ok for s in st if s["tree_nodes"] > 0])
    datasets = list(dict.fromkeys(h["dataset"] for h, _ in traces))
    return {
        "kind": "bench",
        "run": {**run, "mode": manifest.get("mode"), "profile": manifest.get("profile"), "world_size": world,
                "command": manifest.get("command"), "git_commit": (manifest.get("git") or {}).get("commit"),
                "git_dirty": (manifest.get("git") or {}).get("dirty")},
        "turns": {"expected": len(expected) or len(traces), "traced": len(traces), "ok": len(ok),
                  "failed": sum(h["status"] == "failed" for h, _ in traces),
                  "skipped": sum(h["status"] == "skipped" for h, _ in traces),
                  "missing": [k for k in expected if k not in present]},
        "ranks": {"world_size": world, "missing": [r for r in range(world)
                                                   if not os.path.exists(trace.rank_marker_path(run_dir, r))]},
        **{k: overall[k] for k in ("table1", "speedup_of_means", "tau", "verify_steps")},
        "teacher_only_steps": sum(s["tree_nodes"] == 0 for _, st in ok for s in st),
        "tau_drafted": tau_drafted,
        "costs": _costs(ok, tau_drafted, overall["table1"]["speedup"]["mean"]),
        "two_calls": _two_calls(ok, tau_drafted),
        "accept_pos": [{"depth": d + 1, "share": v} for d, v in enumerate(overall["accept_pos"])],
        "accept_by_position": _accept_by_position(ok),
        "accept_after": metrics.accept_after([([s["accepted_len"] for s in st], [s["tree_nodes"] > 0 for s in st])
                                              for _, st in ok]),
        "exactness": {"share": overall["exactness"], "identical": overall["identical"], "turns": len(ok),
                      "mismatches": [{"key": h["key"], **h["mismatch"]} for h, _ in ok if h["mismatch"]]},
        "stages": metrics.stage_stats(_stage_samples(ok)),
        "by_dataset": {d: _brief(_group([(h, s) for h, s in ok if h["dataset"] == d], max_depth))
                       for d in datasets},
        "failures": [{"key": h["key"], "status": h["status"], "errors": h["errors"]}
                     for h, _ in traces if h["status"] != "ok"],
        "per_turn": [_per_turn(h, s) for h, s in traces],
    }


def _brief(g: dict) -> dict:
    t1 = g["table1"]
    return {"turns": g["turns"], "baseline_tokens_per_s": t1["baseline_tokens_per_s"]["mean"],
            "ea_tokens_per_s": t1["ea_tokens_per_s"]["mean"], "speedup_mean": t1["speedup"]["mean"],
            "speedup_p50": t1["speedup"]["p50"], "accept_L_mean": t1["accept_L"]["mean"], "tau": g["tau"],
            "exactness": g["exactness"]}


# --- markdown ----------------------------------------------------------------------------------

def fmt(value, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _md_table1(s: dict) -> list[str]:
    t1 = s["table1"]
    rows = []
    for label, key, digits, suffix in (("Baseline tok/s", "baseline_tokens_per_s", 2, ""),
                                       ("EA tok/s", "ea_tokens_per_s", 2, ""), ("Speedup", "speedup", 2, "x"),
                                       ("accept_L (L_k)", "accept_L", 2, "")):
        d = t1[key]
        rows.append([label] + [fmt(d[k], digits, suffix) for k in ("mean", "p50", "p90", "p99")] + [str(d["n"])])
    return md_table(["Metric", "mean", "p50", "p90", "p99", "n"], rows)


def _md_stages(stages: dict) -> list[str]:
    rows = [[name, "per turn" if name in ("prefill", "other") else "per verify step", fmt(v["mean_ms"], 3),
             fmt(v["p99_ms"], 3), fmt(v["p99_over_mean"], 2), str(v["n"])] for name, v in stages.items()]
    return md_table(["stage", "unit", "mean ms", "p99 ms", "p99/mean", "n"], rows)


def _choice(run: dict) -> str:
    """The token choice of a run: greedy, or the sampling parameters (runs before sampling: greedy)."""
    if not run.get("temperature"):
        return "greedy"
    return (f"sampled T={run['temperature']} top_k={run.get('top_k_sample')} top_p={run.get('top_p')} "
            f"seed={run.get('seed')} (teacher-only sampled with the same seed)")


def render_markdown(s: dict) -> str:
    run, turns = s["run"], s["turns"]
    lines = ["# Benchmark summary", ""]
    if run.get("command"):
        lines += ["Command:", "", "```", run["command"], "```", ""]
    lines += [f"draft `{run.get('draft')}`, step `{run.get('step', 'host')}`, mode `{run.get('mode')}`, M={run.get('budget')}, "
              f"Dmax={run.get('max_depth')}, top_k={run.get('top_k')}, score_temperature={run.get('score_temperature', 1.0)}, "
              f"shallow_depth={run.get('shallow_depth')}, "
              f"draft_window={run.get('draft_window')}, "
              f"max_new_tokens={run.get('max_new_tokens')}, {_choice(run)}, datasets {run.get('datasets')}, "
              f"world_size {run.get('world_size')}, git {str(run.get('git_commit'))[:12]}"
              f"{' (dirty)' if run.get('git_dirty') else ''}" + (", PROFILE RUN (not for headline numbers)"
                                                                   if run.get("profile") else ""), "",
              f"Turns: {turns['ok']} ok of {turns['expected']} expected ({turns['failed']} failed, "
              f"{turns['skipped']} skipped, {len(turns['missing'])} missing)."]
    if s["ranks"]["missing"]:
        lines += ["", f"**Ranks missing (no done marker): {s['ranks']['missing']}** — their turns are "
                      f"missing: {turns['missing']}"]
    lines += ["", "## Table 1: throughput and acceptance", ""] + _md_table1(s)
    lines += ["", f"speedup_of_means (mean EA tok/s / mean baseline tok/s): {fmt(s['speedup_of_means'], 3, 'x')}",
              "", "## Acceptance", "", f"tau (tokens per verify step): {fmt(s['tau'], 3)} over "
              f"{s['verify_steps']} verify steps, {s['teacher_only_steps']} of them teacher-only (N = 1: "
              f"low-acceptance fallback or near KV capacity; counted with accept_L 0); "
              f"tau over the drafted steps only: {fmt(s['tau_drafted'], 3)}", ""]
    lines += md_table(["depth d"] + [str(a["depth"]) for a in s["accept_pos"]],
                    [["accept_pos[d]"] + [fmt(a["share"], 3) for a in s["accept_pos"]]])
    for kind, label in (("context", "committed context length (KV-cache tokens)"),
                        ("answer", "answer offset (tokens generated so far)")):
        rows = s["accept_by_position"][kind]
        if rows:
            lines += ["", f"By {label} at the verify step, drafted steps, buckets of {metrics.POSITION_BUCKET}:",
                      ""]
            lines += md_table([f"{kind} tokens", "steps", "accept_L", "tau"],
                              [[f"{b['from']}-{b['to'] - 1}", str(b["steps"]), fmt(b["accept_L"]),
                                fmt(b["tau"])] for b in rows])
    if s.get("accept_after"):
        lines += ["", "By the accept_L of the drafted step before (acceptance streaks; speculative.shallow_depth):", ""]
        lines += md_table(["previous accept_L"] + [str(r["previous"]) for r in s["accept_after"]],
                          [["steps"] + [str(r["steps"]) for r in s["accept_after"]],
                           ["accept_L"] + [fmt(r["accept_L"]) for r in s["accept_after"]]])
    ex = s["exactness"]
    lines += ["", "## Exactness", "", f"{ex['identical']}/{ex['turns']} turns identical "
              f"(exactness {fmt(ex['share'], 3)})."]
    if ex["mismatches"]:
        lines += [""] + md_table(["turn", "first diff", "baseline tok", "EA tok", "margin top1-top2", "gap base-EA"],
                               [[m["key"], str(m["position"]), str(m["baseline_token"]), str(m["ea_token"]),
                                 fmt(m.get("margin"), 4), fmt(m.get("gap"), 4)] for m in ex["mismatches"]])
    lines += ["", "## Per dataset", ""] + md_table(
        ["dataset", "turns", "baseline tok/s", "EA tok/s", "speedup mean", "speedup p50", "accept_L", "tau",
         "exactness"],
        [[d, str(g["turns"]), fmt(g["baseline_tokens_per_s"]), fmt(g["ea_tokens_per_s"]),
          fmt(g["speedup_mean"], 2, "x"), fmt(g["speedup_p50"], 2, "x"), fmt(g["accept_L_mean"]), fmt(g["tau"]),
          fmt(g["exactness"], 3)] for d, g in s["by_dataset"].items()])
    lines += ["", "## Stage breakdown (EA runs)", ""] + _md_stages(s["stages"])
    c = s["costs"]
    lines += ["", f"Step costs: t_dec {fmt(c['t_dec_ms'], 2)} ms per baseline token, t_ver {fmt(c['t_ver_ms'], 2)} "
              f"ms per drafted verify, overhead {fmt(c['overhead_ms'], 2)} ms per drafted step "
              f"({fmt(c['overhead_over_t_dec'], 2)} t_dec); free-drafting bound tau_drafted * t_dec / t_ver = "
              f"{fmt(c['bound'], 2, 'x')}; efficiency (mean speedup / bound) {fmt(c['efficiency'], 3)}."]
    if c["t_ver_ms"] is None and "draft_verify" in s["stages"]:
        lines += ["", "The drafted steps ran draft and verify in one graph call (`draft_verify`), so this run did not "
                  "time the verify forward apart: t_ver, the overhead, the bound and the efficiency need "
                  "`--verify-apart` (docs/metrics.md)."]
    lines += _md_two_calls(s.get("two_calls"))
    if s["failures"]:
        lines += ["", "## Failures", ""] + md_table(
            ["turn", "status", "phase", "error", "dump"],
            [[f["key"], f["status"], e["phase"], f"{e['error_type']}: {e['message'][:120]}".replace("|", "\\|"),
              e.get("dump") or ""] for f in s["failures"] for e in f["errors"]])
    return "\n".join(lines) + "\n"


def _md_two_calls(two: dict | None) -> list[str]:
    if two is None:
        return []
    r, c = two["fused_over_two_calls"], two["costs"]
    return ["", "## Fused step against the two-call step (--verify-apart)", "",
            f"{two['same_tokens']}/{two['turns']} turns gave the fused run's tokens; t_ver above is the two-call "
            f"step's verify stage at the same steps. Per turn, fused tok/s / two-call tok/s: mean "
            f"{fmt(r['mean'], 3, 'x')}, p50 {fmt(r['p50'], 3, 'x')}. Two-call step: speedup mean "
            f"{fmt(two['speedup']['mean'], 2, 'x')}, draft call {fmt(two['stage_ms'].get('draft'), 2)} ms, "
            f"overhead {fmt(c['overhead_ms'], 2)} ms "
            f"({fmt(c['overhead_over_t_dec'], 2)} t_dec), efficiency {fmt(c['efficiency'], 3)}."]


def write_report(run_dir: str, plots: bool = True) -> dict:
    """Recompute summary.json + summary.md (+ plots/) from the run directory's traces."""
    s = summarize(run_dir)
    trace.write_json(os.path.join(run_dir, "summary.json"), s)
    atomic_write(os.path.join(run_dir, "summary.md"), lambda fh: fh.write(render_markdown(s)))
    if plots:
        from eagle_ms.bench.plots import plot_run

        plot_run(s, os.path.join(run_dir, "plots"))
    return s
