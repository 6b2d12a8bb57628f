"""Summary statistics, report and sweep tables on synthetic traces, against hand-computed values.

The builders (``write_run`` and friends) write run directories by hand; tests/test_trace.py uses them
too. Every number is chosen so the expected statistics can be computed by hand (comments give them).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from eagle_ms import trace
from eagle_ms import metrics
from eagle_ms.bench.summary import summarize, write_report
from eagle_ms.bench.sweep import SweepPoint, parse_windows, plan_sweeps, unique_points, write_sweep_report

approx = pytest.approx


def step(accepted: int, draft=0.001, verify=0.004, nodes=4) -> dict:
    return {"i": 0, "tree_nodes": nodes, "tree_depth": 3 if nodes else 0, "accepted_len": accepted,
            "accepted_path": list(range(accepted + 1)), "reorder_copy": False,
            "stage_s": {"draft": draft, "verify": verify}}


def header(key, dataset, index, base_tokens, ea_tokens, base_tps, ea_tps, prefill=0.01, total=0.05,
           status="ok", mismatch=None, prompt=(1, 2, 3)):
    qid, turn = int(key.split("-")[-2]), int(key.split("-")[-1])
    base = None if base_tokens is None else {
        "tokens": base_tokens, "n_tokens": len(base_tokens), "total_s": total, "prefill_s": prefill,
        "tokens_per_s": base_tps, "stop_reason": "max_new_tokens", "verify_steps": len(base_tokens)}
    ea = None if ea_tokens is None else {
        "tokens": ea_tokens, "n_tokens": len(ea_tokens), "total_s": total, "prefill_s": prefill,
        "tokens_per_s": ea_tps, "stop_reason": "max_new_tokens", "verify_steps": 2, "tau": None}
    ok = status == "ok"
    return {"key": key, "dataset": dataset, "question_id": qid, "turn": turn, "category": "c", "index": index,
            "rank": 0, "order": ["baseline", "ea"], "prompt_tokens": len(prompt), "prompt_ids": list(prompt),
            "status": status, "errors": [] if ok else [{"phase": "ea", "error_type": "TreeInvariantError",
                                                         "message": "planted", "dump": "failures/x.json"}],
            "baseline": base, "ea": ea, "speedup": ea_tps / base_tps if ok else None,
            "exact": (base_tokens == ea_tokens) if ok else None, "mismatch": mismatch}


MISMATCH = {"position": 2, "baseline_token": 7, "ea_token": 9, "top1": 7, "top2": 9, "margin": 0.01, "gap": 0.01}


def write_run(run_dir: str, max_depth: int = 3, b_tps: float = 200.0) -> str:
    """Turns: A ok exact (speedup 1.5, A = [2, 0, 3]); B ok with a mismatch at position 2 (speedup
    b_tps/200, A = [1, 1]); C failed; D expected but missing."""
    keys = ["mt_bench-81-1", "humaneval-0-1", "humaneval-1-1", "humaneval-2-1"]
    trace.write_json(os.path.join(run_dir, trace.MANIFEST), {
        "kind": "bench", "command": "eagle-ms bench --synthetic", "mode": "performance", "profile": False,
        "run": {"draft": "test", "budget": 8, "max_depth": max_depth, "top_k": 4, "draft_window": None,
                "max_new_tokens": 4, "datasets": ["mt_bench", "humaneval"]},
        "world_size": 1, "git": {"commit": "abc", "dirty": False},
        "turns": [{"key": k, "index": i, "rank": 0} for i, k in enumerate(keys)]})
    trace.write_turn_trace(run_dir, header(keys[0], "mt_bench", 0, [1, 2, 3, 4], [1, 2, 3, 4], 100.0, 150.0,
                                           prefill=0.01), [step(2), step(0), step(3)])
    trace.write_turn_trace(run_dir, header(keys[1], "humaneval", 1, [5, 6, 7], [5, 6, 9], 200.0, b_tps,
                                           prefill=0.03, mismatch=MISMATCH), [step(1), step(1)])
    trace.write_turn_trace(run_dir, header(keys[2], "humaneval", 2, [5], None, 1.0, 0.0, status="failed"), [])
    trace.write_rank_marker(run_dir, 0, {"world_size": 1})
    return run_dir


# --- tests ---------------------------------------------------------------------------------------

def test_percentiles_tau_accept_pos_by_hand():
    d = metrics.describe([0, 1, 2, 3, 10])
    assert d == {"n": 5, "mean": approx(3.2), "p50": approx(2.0), "p90": approx(7.2), "p99": approx(9.72)}
    assert metrics.describe([]) == {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    assert metrics.tau([2, 0, 3, 1, 1]) == approx(2.4)
    assert metrics.tau([]) is None
    assert metrics.accept_pos([0, 1, 3], 3) == approx([2 / 3, 1 / 3, 1 / 3])
    assert metrics.accept_pos([], 2) == [None, None]


def test_accept_by_position_by_hand():
    # prompt 10, A = [2, 0, 3]: steps start with 10, 10 + 3 = 13, 13 + 1 = 14 tokens committed
    assert metrics.step_positions(10, [2, 0, 3]).tolist() == [10, 13, 14]
    assert metrics.step_positions(10, []).tolist() == []
    # + a turn with prompt 300, A = [1] (at 300), and one with prompt 253, A = [4, 0] (at 253, 258)
    all_drafted = [(10, [2, 0, 3], [True] * 3), (300, [1], [True]), (253, [4, 0], [True] * 2)]
    rows = metrics.accept_by_position(all_drafted, 256)
    assert rows == [{"from": 0, "to": 256, "steps": 4, "accept_L": approx(9 / 4), "tau": approx(13 / 4)},
                    {"from": 256, "to": 512, "steps": 2, "accept_L": approx(0.5), "tau": approx(1.5)}]
    # teacher-only steps advance the position but stay out of the statistics: the A = 0 at 13 and the
    # A = 0 at 258 drop out, and the 256 bucket keeps only the step at 300
    some_teacher_only = [(10, [2, 0, 3], [True, False, True]), (300, [1], [True]), (253, [4, 0], [True, False])]
    assert metrics.accept_by_position(some_teacher_only, 256) == [
        {"from": 0, "to": 256, "steps": 3, "accept_L": approx(3.0), "tau": approx(4.0)},
        {"from": 256, "to": 512, "steps": 1, "accept_L": approx(1.0), "tau": approx(2.0)}]
    assert metrics.accept_by_position([], 256) == []
    with pytest.raises(ValueError, match="bucket"):
        metrics.accept_by_position([(1, [0], [True])], 0)


def test_accept_after_by_hand():
    # turn 1 drafted A = 3, 0, 5 (the 1 is a teacher-only step): pairs 3 -> 0, 0 -> 5; turn 2: 0 -> 2 -> 2;
    # a turn's first drafted step has no previous step, and turns do not chain
    turns = [([3, 0, 1, 5], [True, True, False, True]), ([0, 2, 2], [True] * 3), ([7], [True])]
    assert metrics.accept_after(turns) == [{"previous": 0, "steps": 2, "accept_L": approx(3.5)},
                                           {"previous": 2, "steps": 1, "accept_L": approx(2.0)},
                                           {"previous": 3, "steps": 1, "accept_L": approx(0.0)}]
    assert metrics.accept_after([]) == []


def test_divergence_exactness_margin():
    assert metrics.first_divergence([1, 2, 3], [1, 5]) == 1
    assert metrics.first_divergence([1, 2], [1, 2, 3]) == 2
    assert metrics.first_divergence([4, 5], [4, 5]) is None
    assert metrics.exactness([True, False, True, True]) == 0.75
    m = metrics.logit_margin(np.array([0.0, 3.0, 2.5, -1.0]), baseline_token=1, ea_token=3)
    assert (m["top1"], m["top2"]) == (1, 2)
    assert m["margin"] == approx(0.5) and m["gap"] == approx(4.0)
    s = metrics.stage_stats({"verify": [0.001, 0.003], "empty": []})
    assert list(s) == ["verify"]
    assert s["verify"]["mean_ms"] == approx(2.0)
    assert s["verify"]["p99_ms"] == approx(1.0 + 0.99 * 2.0)
    assert s["verify"]["p99_over_mean"] == approx((1.0 + 0.99 * 2.0) / 2.0)


def test_summary_of_synthetic_traces(tmp_path):
    s = summarize(write_run(str(tmp_path)))
    t1 = s["table1"]
    # speedups [1.5, 1.0]; baseline [100, 200]; EA [150, 200]; accept_L flattened [2, 0, 3, 1, 1]
    assert t1["speedup"] == {"n": 2, "mean": approx(1.25), "p50": approx(1.25), "p90": approx(1.45),
                             "p99": approx(1.495)}
    assert t1["baseline_tokens_per_s"]["mean"] == approx(150.0)
    assert t1["ea_tokens_per_s"]["p90"] == approx(150 + 0.9 * 50)
    assert t1["accept_L"] == {"n": 5, "mean": approx(1.4), "p50": approx(1.0), "p90": approx(2.6),
                              "p99": approx(2.96)}
    assert s["speedup_of_means"] == approx(175 / 150)
    assert s["tau"] == approx(2.4) and s["verify_steps"] == 5 and s["teacher_only_steps"] == 0
    assert [a["share"] for a in s["accept_pos"]] == approx([0.8, 0.4, 0.2])
    # both ok turns have 3-token prompts and < 256 tokens: one bucket holding all 5 steps, both ways
    one_bucket = [{"from": 0, "to": 256, "steps": 5, "accept_L": approx(1.4), "tau": approx(2.4)}]
    assert s["accept_by_position"] == {"context": one_bucket, "answer": one_bucket}
    assert s["exactness"]["share"] == 0.5 and s["exactness"]["identical"] == 1
    assert s["exactness"]["mismatches"] == [{"key": "humaneval-0-1", **MISMATCH}]
    assert s["turns"] == {"expected": 4, "traced": 3, "ok": 2, "failed": 1, "skipped": 0,
                          "missing": ["humaneval-2-1"]}
    assert [f["key"] for f in s["failures"]] == ["humaneval-1-1"]
    st = s["stages"]
    assert st["prefill"]["mean_ms"] == approx(20.0) and st["prefill"]["p99_ms"] == approx(29.8)
    assert st["verify"]["mean_ms"] == approx(4.0) and st["verify"]["n"] == 5
    # other = total - prefill - stage sums: A 0.05 - 0.01 - 3 * 0.005, B 0.05 - 0.03 - 2 * 0.005
    assert st["other"]["mean_ms"] == approx(1e3 * (0.025 + 0.01) / 2)
    assert s["by_dataset"]["mt_bench"]["speedup_mean"] == approx(1.5)
    assert s["by_dataset"]["humaneval"]["exactness"] == 0.0
    # t_dec: baseline (total - prefill) / (tokens - 1): A 0.04 / 3, B 0.02 / 2 -> mean 11.667 ms; every step
    # drafted with verify 4 ms and draft 1 ms; bound = tau 2.4 * 11.667 / 4 = 7.0; efficiency 1.25 / 7
    assert s["costs"] == {"t_dec_ms": approx(35 / 3), "t_ver_ms": approx(4.0), "overhead_ms": approx(1.0),
                          "overhead_over_t_dec": approx(3 / 35), "bound": approx(7.0),
                          "efficiency": approx(1.25 / 7.0)}


def test_fused_steps_have_no_verify_time_of_their_own(tmp_path):
    """Stage ``draft_verify`` (draft and verify in one graph call): its mean is reported, but t_ver, the
    overhead and the efficiency are None (nothing timed the verify forward apart); t_dec still stands."""
    run = str(tmp_path)
    fused = [dict(step(a), stage_s={"tensorize": 0.0, "draft_verify": 0.005, "commit": 0.001}) for a in (2, 1)]
    trace.write_turn_trace(run, header("mt_bench-81-1", "mt_bench", 0, [1, 2, 3, 4], [1, 2, 3, 4], 100.0, 150.0),
                           fused)
    s = summarize(run)
    assert s["stages"]["draft_verify"]["mean_ms"] == approx(5.0) and s["stages"]["draft_verify"]["n"] == 2
    # t_dec: (0.05 - 0.01) / 3 tokens
    assert s["costs"] == {"t_dec_ms": approx(40 / 3), "t_ver_ms": None, "overhead_ms": None,
                          "overhead_over_t_dec": None, "bound": None, "efficiency": None}
    write_report(run, plots=False)
    assert "did not time the verify forward apart" in (tmp_path / "summary.md").read_text()


def test_fused_steps_take_t_ver_from_the_two_call_run_of_the_same_steps(tmp_path):
    """--verify-apart: each fused step carries the two-call step's stages of the same step; t_ver is their
    verify stage, the overhead the fused stages minus it; the two-call run's own speedup and costs, and the
    per-turn fused / two-call tok/s, are reported apart."""
    run = str(tmp_path)
    fused = [dict(step(a), stage_s={"draft_verify": 0.005, "commit": 0.001},
                  two_calls_stage_s={"draft": 0.002, "verify": 0.004, "commit": 0.001}) for a in (2, 1)]
    fused.append(step(0, nodes=0))  # a teacher-only step: in no cost
    h = header("mt_bench-81-1", "mt_bench", 0, [1, 2, 3, 4], [1, 2, 3, 4], 100.0, 150.0)
    h["ea_two_calls"] = {"n_tokens": 4, "total_s": 0.06, "prefill_s": 0.01, "tokens_per_s": 120.0,
                         "stop_reason": "max_new_tokens", "verify_steps": 3, "tau": None, "fallback_bar": None,
                         "same_tokens": True}
    trace.write_turn_trace(run, h, fused)
    s = summarize(run)
    # t_dec (0.05 - 0.01) / 3 = 13.333 ms; tau_drafted (3 + 2) / 2 = 2.5; t_ver 4 ms -> bound 2.5 * 13.333 / 4
    # = 8.333; fused speedup 1.5; overhead 6 - 4 = 2 ms per drafted step
    assert s["costs"] == {"t_dec_ms": approx(40 / 3), "t_ver_ms": approx(4.0), "overhead_ms": approx(2.0),
                          "overhead_over_t_dec": approx(0.15), "bound": approx(25 / 3),
                          "efficiency": approx(1.5 / (25 / 3))}
    two = s["two_calls"]
    assert two["turns"] == 1 and two["same_tokens"] == 1
    assert two["fused_over_two_calls"]["mean"] == approx(150 / 120)
    assert two["speedup"]["mean"] == approx(1.2)  # 120 / 100
    # two-call step: 7 ms of stages, verify 4 -> overhead 3 ms; efficiency 1.2 / 8.333
    assert two["costs"]["overhead_ms"] == approx(3.0) and two["costs"]["efficiency"] == approx(1.2 / (25 / 3))
    assert two["stage_ms"] == {"draft": approx(2.0), "verify": approx(4.0), "commit": approx(1.0)}
    write_report(run, plots=False)
    text = (tmp_path / "summary.md").read_text()
    assert "## Fused step against the two-call step (--verify-apart)" in text
    assert "1/1 turns gave the fused run's tokens" in text and "mean 1.250x" in text and "draft call 2.00 ms" in text
    assert "did not time the verify forward apart" not in text


def test_teacher_only_steps_are_counted(tmp_path):
    run = str(tmp_path)
    trace.write_turn_trace(run, header("mt_bench-81-1", "mt_bench", 0, [1, 2, 3, 4], [1, 2, 3, 4], 100.0, 120.0),
                           [step(2), step(0, nodes=0), step(0, nodes=0)])
    s = write_report(run, plots=False)
    assert s["teacher_only_steps"] == 2 and s["verify_steps"] == 3 and s["tau"] == approx(5 / 3)
    assert s["tau_drafted"] == approx(3.0)
    # the position tables keep only the drafted first step (at context 3, the prompt length)
    assert s["accept_by_position"]["context"] == [{"from": 0, "to": 256, "steps": 1, "accept_L": 2.0,
                                                   "tau": 3.0}]
    assert "3 verify steps, 2 of them teacher-only" in (tmp_path / "summary.md").read_text()


def test_report_writes_markdown_and_plots(tmp_path):
    run = write_run(str(tmp_path))
    s = write_report(run)
    text = (tmp_path / "summary.md").read_text()
    assert "| Speedup | 1.25x | 1.25x | 1.45x | 1.50x | 2 |" in text
    assert "humaneval-0-1 | 2 | 7 | 9 |" in text and "eagle-ms bench --synthetic" in text
    assert "1/2 turns identical" in text and "TreeInvariantError" in text
    assert text.count("| 0-255 | 5 | 1.40 | 2.40 |") == 2
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads(json.dumps(s))
    for name in ("speedup_hist", "speedup_vs_accept", "accept_pos", "stages"):
        assert (tmp_path / "plots" / f"{name}.png").stat().st_size > 1000


def test_sweep_plans():
    t2 = plan_sweeps(16, 10, preset="table2")
    assert [(s.name, [(p.budget, p.max_depth) for p in s.points]) for s in t2] == [
        ("budget", [(16, 10), (32, 10), (64, 10), (128, 10), (256, 10)]),
        ("max_depth", [(64, 4), (64, 8), (64, 10), (64, 12), (64, 16)])]
    assert len(unique_points(t2)) == 9  # M=64, Dmax=10 runs once
    grid = plan_sweeps(16, 10, budgets=(8, 16), depths=(3, 5))
    assert grid[0].axis == "grid" and len(grid[0].points) == 4
    win = plan_sweeps(16, 10, windows=parse_windows("none,128"))
    assert [p.draft_window for p in win[0].points] == [None, 128]
    assert [s.axis for s in plan_sweeps(16, 10, depths=(4, 8))] == ["max_depth"]
    with pytest.raises(ValueError, match="nothing to sweep"):
        plan_sweeps(16, 10)
    with pytest.raises(ValueError, match="integers"):
        parse_windows("none,abc")


def test_sweep_report_from_point_traces(tmp_path):
    points = [SweepPoint(8, 3), SweepPoint(16, 3)]
    for p, b_tps in zip(points, (200.0, 400.0)):
        write_run(str(tmp_path / "points" / p.name), b_tps=b_tps)
    plan = [{"name": "budget", "axis": "budget",
             "points": [{"name": p.name, "budget": p.budget, "max_depth": 3, "draft_window": None} for p in points]}]
    trace.write_json(str(tmp_path / "sweep.json"), {"kind": "sweep", "command": "eagle-ms sweep x", "plan": plan})
    data = write_sweep_report(str(tmp_path))
    rows = data["results"][0]["rows"]
    assert [r["speedup_mean"] for r in rows] == approx([1.25, 1.75])  # (1.5 + b_tps/200) / 2
    md = (tmp_path / "sweep.md").read_text()
    assert "## Sweep `budget`" in md and "| M16-D3-Wnone | 16 | 3 | none | 2 |" in md
    assert (tmp_path / "plots" / "sweep_budget.png").exists()
