"""Run directories: manifest, per-turn traces (JSONL), failure dumps, rank markers, and trace diff.

Layout of a benchmark run directory (one process or many ranks writing into the same directory)::

    manifest.json              config, versions, git commit, mode, env flags, device, data files + sha256,
                               the expected turn list and its rank assignment (written by rank 0)
    traces/<key>.jsonl         one file per turn, <key> = <dataset>-<question_id>-<turn>:
                                 line 1  {"type": "turn", ...}  prompt, both runs' tokens and timing,
                                         speedup, exactness, the mismatch (if any), status, errors
                                 then    {"type": "step", ...}  one line per EA verify step
    failures/<key>-<phase>.json  a dump per exception or invariant failure (turn, inputs, tree arrays,
                               cache length, traceback); ``tree-*.json`` dumps come from reference-mode
                               invariant checks (eagle_ms/tree_checks.py)
    ranks/rank-<r>.json        written by each rank when it is done (its turns, failures, time)
    summary.json, summary.md   derived from traces only (``eagle-ms report`` rewrites them)
    plots/*.png
    .lock-rank-<r>             while rank r runs: its lock (eagle_ms/locks.py; removed when it ends)

A trace file is written once, when its turn ends (temp file + rename), so a reader never sees half of it.
"""
from __future__ import annotations

import itertools
import json
import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from importlib import metadata
from typing import Any, Iterable

from eagle_ms.files import atomic_write, file_sha256, write_json_atomic
from eagle_ms.metrics import first_divergence

MANIFEST = "manifest.json"
TRACES = "traces"
FAILURES = "failures"
RANKS = "ranks"
ENV_PREFIXES = ("EAGLE_MS_", "PANGU_", "MS_", "GLOG_", "RANK_", "DEVICE_ID", "ASCEND_", "HCCL_",
                "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
PACKAGES = ("mindspore", "mindformers", "numpy", "sentencepiece", "safetensors", "matplotlib", "eagle_ms")


# --- small file helpers ------------------------------------------------------------------------

def write_json(path: str, obj: Any, indent: int | None = 1) -> str:
    """Write JSON atomically (eagle_ms/files.py); returns ``path``."""
    return write_json_atomic(path, obj, indent=indent, newline=True)


def read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


# --- manifest ----------------------------------------------------------------------------------

def package_versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_info(path: str | None = None) -> dict:
    """Commit and dirty state of the repository holding ``path`` (default: this package); Nones if none."""
    where = path or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "-C", where, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "modified_files": None}
    modified = [line[3:] for line in status.splitlines() if line.strip()]
    return {"commit": commit, "dirty": bool(modified), "modified_files": modified}


def env_flags() -> dict:
    """Environment variables that can change what a run does (mode overrides, MindSpore, ranks)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def device_info(device_target: str) -> dict:
    return {"device_target": device_target, "hostname": socket.gethostname(), "machine": platform.machine(),
            "platform": platform.platform(), "cpu_count": os.cpu_count()}


def data_files(paths: Iterable[str]) -> list[dict]:
    return [{"path": os.path.abspath(p), "sha256": file_sha256(p), "bytes": os.path.getsize(p)} for p in paths]


# --- traces ------------------------------------------------------------------------------------

def trace_path(run_dir: str, key: str) -> str:
    return os.path.join(run_dir, TRACES, f"{key}.jsonl")


def write_turn_trace(run_dir: str, header: dict, steps: list[dict]) -> str:
    """``traces/<key>.jsonl``: the turn header line, then one line per verify step."""
    def write(fh):
        fh.write(json.dumps({"type": "turn", **header}, ensure_ascii=False) + "\n")
        for step in steps:
            fh.write(json.dumps({"type": "step", **step}) + "\n")
    return atomic_write(trace_path(run_dir, header["key"]), write)


def read_turn_trace(path: str) -> tuple[dict, list[dict]]:
    """(header, steps) of one trace file; ValueError naming the file and line when malformed."""
    header, steps = None, []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
            kind = rec.pop("type", None) if isinstance(rec, dict) else None
            if kind == "turn" and header is None and lineno == 1:
                header = rec
            elif kind == "step" and header is not None:
                steps.append(rec)
            else:
                raise ValueError(f"{path}:{lineno}: expected a 'turn' line first, then 'step' lines")
    if header is None:
        raise ValueError(f"{path}: empty trace")
    return header, steps


def read_traces(run_dir: str) -> list[tuple[dict, list[dict]]]:
    """Every turn trace of a run directory, sorted by the turn's index in the unsharded turn list."""
    folder = os.path.join(run_dir, TRACES)
    if not os.path.isdir(folder):
        return []
    out = [read_turn_trace(os.path.join(folder, name)) for name in sorted(os.listdir(folder))
           if name.endswith(".jsonl")]
    return sorted(out, key=lambda item: (item[0].get("index", 0), item[0]["key"]))


def turn_headers(run_dir: str) -> dict[str, dict]:
    """The turn headers of a run directory by turn key (``read_traces`` order); a directory that does not
    exist is a FileNotFoundError naming it."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run directory not found: {run_dir}")
    return {h["key"]: h for h, _ in read_traces(run_dir)}


# --- failures and rank markers -----------------------------------------------------------------

_DUMP_COUNTER = itertools.count()


def write_failure_dump(run_dir: str, dump: dict, stem: str | None = None) -> str:
    """The project's one failure-dump writer: ``dump`` as JSON at ``<run_dir>/failures/<stem>.json``
    (atomically); returns the path. Without ``stem`` the name is ``tree-<time>-<pid>-<counter>``, unique
    within the directory (reference-mode tree invariant failures, malformed draft trees)."""
    if stem is None:
        stem = f"tree-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{next(_DUMP_COUNTER):04d}"
    return write_json(os.path.join(run_dir, FAILURES, f"{stem}.json"), dump)


def write_failure(run_dir: str, key: str, phase: str, exc: BaseException, context: dict) -> str:
    """``failures/<key>-<phase>.json``: the exception, its traceback, the turn context and, for a tree
    invariant failure, the tree arrays (``exc.dump``) and the path of any dump the check itself wrote."""
    dump = {"key": key, "phase": phase, "error_type": type(exc).__name__, "message": str(exc),
            "traceback": traceback.format_exception(type(exc), exc, exc.__traceback__), **context}
    tree = getattr(exc, "dump", None)
    if isinstance(tree, dict):
        dump["tree"] = tree
        dump["tree_dump_path"] = getattr(exc, "dump_path", None)
    return write_failure_dump(run_dir, dump, f"{key}-{phase}")


def rank_marker_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, RANKS, f"rank-{rank}.json")


def write_rank_marker(run_dir: str, rank: int, info: dict) -> str:
    return write_json(rank_marker_path(run_dir, rank), {"rank": rank, "host": socket.gethostname(),
                                                        "pid": os.getpid(), "time": time.time(), **info})


def wait_for_ranks(run_dir: str, world_size: int, timeout_s: float, poll_s: float = 1.0) -> list[int]:
    """Wait (at most ``timeout_s``) until every rank's marker exists; return the ranks still missing."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r in range(world_size) if not os.path.exists(rank_marker_path(run_dir, r))]
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(poll_s)


# --- trace diff --------------------------------------------------------------------------------

def diff_runs(run_a: str, run_b: str) -> list[dict]:
    """Per turn (union of both runs, in turn order): do the generated tokens agree, and where do they
    first diverge? Compares the EA tokens and the baseline tokens separately, and the prompts.
    A run directory that does not exist is a FileNotFoundError naming it."""
    a, b = turn_headers(run_a), turn_headers(run_b)
    if not a and not b:
        raise ValueError(f"no traces in {run_a} or {run_b}")
    order = sorted(set(a) | set(b), key=lambda k: ((a.get(k) or b.get(k)).get("index", 0), k))
    rows = []
    for key in order:
        ha, hb = a.get(key), b.get(key)
        row = {"key": key, "in_a": ha is not None, "in_b": hb is not None}
        if ha is not None and hb is not None:
            row["prompt_equal"] = ha.get("prompt_ids") == hb.get("prompt_ids")
            for run in ("ea", "baseline"):
                ta = (ha.get(run) or {}).get("tokens")
                tb = (hb.get(run) or {}).get("tokens")
                if ta is None or tb is None:  # a failed run: consistent only if it failed in both
                    both = ta is None and tb is None
                    row[run] = {"agree": True if both else None, "first_divergence": None,
                                "note": "no tokens in either (failed)" if both else
                                f"no tokens in {'A' if ta is None else 'B'} (failed)"}
                    continue
                pos = first_divergence(ta, tb)
                row[run] = {"agree": pos is None, "first_divergence": pos, "len_a": len(ta), "len_b": len(tb),
                            "a_token": ta[pos] if pos is not None and pos < len(ta) else None,
                            "b_token": tb[pos] if pos is not None and pos < len(tb) else None}
        rows.append(row)
    return rows


def format_diff(rows: list[dict], run_a: str, run_b: str) -> str:
    """A readable per-turn table and a final count line."""
    lines = [f"A = {run_a}", f"B = {run_b}",
             f"{'turn':<24} {'prompt':<7} {'EA tokens':<34} {'baseline tokens':<34}"]
    agree = 0
    for r in rows:
        if not (r["in_a"] and r["in_b"]):
            lines.append(f"{r['key']:<24} only in {'A' if r['in_a'] else 'B'}")
            continue
        cells = []
        for run in ("ea", "baseline"):
            d = r[run]
            if "note" in d:
                cells.append(d["note"])
            elif d["agree"]:
                cells.append(f"agree ({d['len_a']})")
            else:
                cells.append(f"DIFFER at {d['first_divergence']}: {d['a_token']} vs {d['b_token']}")
        ok = r["ea"]["agree"] and r["baseline"]["agree"] and r["prompt_equal"]
        agree += bool(ok)
        lines.append(f"{r['key']:<24} {'same' if r['prompt_equal'] else 'DIFFER':<7} {cells[0]:<34} {cells[1]:<34}")
    both = sum(1 for r in rows if r["in_a"] and r["in_b"])
    lines.append(f"{agree}/{both} turns in both runs agree (prompt, EA and baseline tokens); "
                 f"{len(rows) - both} turns in only one run")
    return "\n".join(lines)
