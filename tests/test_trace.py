"""Run-directory files: traces round-trip, malformed traces, manifest helpers, rank wait, trace diff, trace speed."""
import hashlib
import json
import os
import time

import pytest
from test_bench_summary import write_run

from eagle_ms import trace
from eagle_ms.cli import main

approx = pytest.approx


def test_trace_round_trip_and_malformed(tmp_path):
    run = str(tmp_path)
    trace.write_turn_trace(run, {"key": "d-1-1", "index": 3}, [{"accepted_len": 2}, {"accepted_len": 0}])
    trace.write_turn_trace(run, {"key": "d-0-1", "index": 1}, [])
    items = trace.read_traces(run)
    assert [h["key"] for h, _ in items] == ["d-0-1", "d-1-1"]  # sorted by turn index
    assert items[1][1] == [{"accepted_len": 2}, {"accepted_len": 0}]
    bad = tmp_path / "traces" / "d-2-1.jsonl"
    bad.write_text('{"type": "step", "i": 0}\n')
    with pytest.raises(ValueError, match=r"d-2-1.jsonl:1: expected a 'turn' line first"):
        trace.read_traces(run)
    bad.write_text('{"type": "turn", "key": "d-2-1"}\n{oops\n')
    with pytest.raises(ValueError, match=r"d-2-1.jsonl:2: invalid JSON"):
        trace.read_traces(run)


def test_manifest_helpers(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_bytes(b"abc\n")
    assert trace.data_files([str(f)])[0]["sha256"] == hashlib.sha256(b"abc\n").hexdigest()
    git = trace.git_info()
    assert set(git) == {"commit", "dirty", "modified_files"}
    assert git["commit"] is None or len(git["commit"]) == 40
    os.environ["EAGLE_MS_MODE"] = "reference"
    try:
        assert trace.env_flags()["EAGLE_MS_MODE"] == "reference"
    finally:
        del os.environ["EAGLE_MS_MODE"]
    assert trace.package_versions()["mindspore"]


def test_wait_for_ranks_is_bounded(tmp_path):
    run = str(tmp_path)
    trace.write_rank_marker(run, 0, {"world_size": 3})
    trace.write_rank_marker(run, 2, {"world_size": 3})
    t0 = time.monotonic()
    assert trace.wait_for_ranks(run, 3, timeout_s=0.3, poll_s=0.05) == [1]
    assert time.monotonic() - t0 < 2.0


def test_failure_dump_carries_tree_arrays(tmp_path):
    class Planted(ValueError):
        dump = {"parent": [0, 2, 0], "check": "draft_parent_before_child"}
        dump_path = None
    try:
        raise Planted("bad tree")
    except Planted as exc:
        path = trace.write_failure(str(tmp_path), "d-1-1", "ea", exc, {"prompt_ids": [1, 2], "cache_length": 9})
    dump = json.loads(open(path).read())
    assert os.path.basename(path) == "d-1-1-ea.json"
    assert dump["tree"]["parent"] == [0, 2, 0] and dump["cache_length"] == 9
    assert dump["error_type"] == "Planted" and "bad tree" in dump["traceback"][-1]


def test_trace_diff(tmp_path, capsys):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_run(a)
    write_run(b)
    assert main(["trace", "diff", a, b]) == 0
    assert "3/3 turns in both runs agree" in capsys.readouterr().out
    # B: the EA tokens of humaneval-0-1 change at position 1; mt_bench-81-1 missing from B
    path = trace.trace_path(b, "humaneval-0-1")
    header, steps = trace.read_turn_trace(path)
    header["ea"]["tokens"] = [5, 8, 9]
    trace.write_turn_trace(b, header, steps)
    os.remove(trace.trace_path(b, "mt_bench-81-1"))
    rows = {r["key"]: r for r in trace.diff_runs(a, b)}
    assert rows["humaneval-0-1"]["ea"] == {"agree": False, "first_divergence": 1, "len_a": 3, "len_b": 3,
                                           "a_token": 6, "b_token": 8}
    assert rows["humaneval-0-1"]["baseline"]["agree"] is True
    assert rows["mt_bench-81-1"]["in_b"] is False
    assert rows["humaneval-1-1"]["ea"]["agree"] is True  # failed in both: consistent
    assert main(["trace", "diff", a, b]) == 1
    out = capsys.readouterr().out
    assert "DIFFER at 1: 6 vs 8" in out and "only in A" in out


def test_trace_diff_against_a_missing_directory_says_so(tmp_path, capsys):
    write_run(str(tmp_path / "a"))
    assert main(["trace", "diff", str(tmp_path / "a"), str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert f"run directory not found: {tmp_path / 'nope'}" in err and "Traceback" not in err


def _retime(run, key, base_tps, ea_tps, prompt=None):
    """Set one turn's baseline / EA tokens/s (and its speedup) in a written run; optionally its prompt."""
    header, steps = trace.read_turn_trace(trace.trace_path(run, key))
    header["baseline"]["tokens_per_s"], header["ea"]["tokens_per_s"] = base_tps, ea_tps
    header["speedup"] = ea_tps / base_tps
    if prompt is not None:
        header["prompt_ids"] = prompt
    trace.write_turn_trace(run, header, steps)


def test_trace_speed_pairs_turns_and_reports_ratios_by_hand(tmp_path, capsys):
    from eagle_ms.bench.speed_compare import compare_speed

    before, after = str(tmp_path / "before"), str(tmp_path / "after")
    write_run(before)               # ok turns: mt_bench-81-1 (100, 150 tok/s), humaneval-0-1 (200, 200)
    write_run(after, b_tps=300.0)   # humaneval-0-1: (200, 300)
    _retime(after, "mt_bench-81-1", 150.0, 300.0)
    c = compare_speed(before, after)
    assert c["turns"] == 2 and c["not_ok"] == ["humaneval-1-1"] and c["prompt_differs"] == []
    assert c["only_before"] == c["only_after"] == [] and c["ea_tokens_differ"] == []
    # baseline ratios 150/100 = 1.5 and 200/200 = 1; EA ratios 300/150 = 2 and 300/200 = 1.5
    assert c["baseline"] == {"before_mean": approx(150.0), "after_mean": approx(175.0),
                             "ratio_of_means": approx(350 / 300), "median_ratio": approx(1.25),
                             "geomean_ratio": approx(1.5 ** 0.5), "turns_faster": 1}
    assert c["ea"] == {"before_mean": approx(175.0), "after_mean": approx(300.0),
                       "ratio_of_means": approx(600 / 350), "median_ratio": approx(1.75),
                       "geomean_ratio": approx(3.0 ** 0.5), "turns_faster": 2}
    assert c["speedup_mean"] == {"before": approx(1.25), "after": approx(1.75)}  # (1.5 + 1) / 2, (2 + 1.5) / 2
    assert main(["trace", "speed", before, after]) == 0
    out = capsys.readouterr().out
    assert "2 turns paired" in out and "| speculative (EA) tokens/s | 175.00 | 300.00 | 1.714x | 1.750x |" in out

    _retime(after, "mt_bench-81-1", 150.0, 300.0, prompt=[1, 2, 4])  # a different prompt: left out, listed
    c = compare_speed(before, after)
    assert c["turns"] == 1 and c["prompt_differs"] == ["mt_bench-81-1"]
    assert c["ea"]["ratio_of_means"] == approx(1.5)


def test_trace_speed_refuses_missing_runs_and_runs_with_nothing_in_common(tmp_path, capsys):
    before, other = str(tmp_path / "before"), str(tmp_path / "other")
    write_run(before)
    assert main(["trace", "speed", before, str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert f"run directory not found: {tmp_path / 'nope'}" in err and "Traceback" not in err
    os.makedirs(other)
    assert main(["trace", "speed", before, other]) == 2
    assert "no turn is ok in both" in capsys.readouterr().err
