"""Run-directory files: traces round-trip, malformed traces, manifest helpers, rank wait, trace diff."""
import hashlib
import json
import os
import time

import pytest
from test_bench_summary import write_run

from eagle_ms import trace
from eagle_ms.cli import main


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
