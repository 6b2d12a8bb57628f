"""``--resume`` of a bench run: which turns an interrupted run finished, and whether it is this command's run.

A turn's trace is written once, atomically, when the turn ends (eagle_ms/trace.py), so every trace in
``traces/`` is a whole turn. The run's identity is its manifest's mode, profile, world size, config and
turn list plus the question files' sha256; ``resume_manifest`` refuses a resume that would change any of
them, naming the first differing entry.
"""
from __future__ import annotations

import json
import os
import sys

from eagle_ms import trace


def finished_turns(out: str, my_keys: list[str]) -> dict[str, dict]:
    """Headers of this rank's turns whose trace is present, by key (an unreadable one is run again)."""
    done = {}
    for key in my_keys:
        path = trace.trace_path(out, key)
        if not os.path.exists(path):
            continue
        try:
            done[key] = trace.read_turn_trace(path)[0]
        except ValueError as exc:
            print(f"warning: {exc}; turn {key} runs again", file=sys.stderr)
    return done


# The manifest entries that define a run: a resume must not change them.
_RUN_IDENTITY = ("mode", "profile", "world_size", "config", "turns")


def resume_mismatch(stored: dict, current: dict) -> str | None:
    """Why the run in ``stored`` (its manifest) is not the one ``current`` would start, or None."""
    for key in _RUN_IDENTITY:
        where = _first_difference(stored.get(key), current.get(key), key)
        if where is not None:
            return where
    old = [d.get("sha256") for d in stored.get("data_files", [])]
    new = [d.get("sha256") for d in current.get("data_files", [])]
    if old != new:
        return "data_files: the question files' sha256 differ from the run's"
    return None


def _first_difference(a, b, path: str) -> str | None:
    """'path: run has A, this command B' at the first (depth-first) differing entry, else None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            where = _first_difference(a.get(k), b.get(k), f"{path}.{k}")
            if where is not None:
                return where
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            where = _first_difference(x, y, f"{path}[{i}]")
            if where is not None:
                return where
        return None
    return None if a == b else f"{path}: the run has {a!r}, this command {b!r}"


def resume_manifest(out: str, current: dict, my_keys: list[str]) -> dict | None:
    """The stored manifest with this resume appended, or None when ``out`` holds no run yet.

    Raises ValueError naming the first entry in which the stored run differs from this command's, and
    when ``out`` holds traces of ``my_keys`` but no manifest (nothing shows which command wrote them)."""
    path = os.path.join(out, trace.MANIFEST)
    if not os.path.exists(path):
        if any(os.path.exists(trace.trace_path(out, key)) for key in my_keys):
            raise ValueError(f"--resume: {out} holds turn traces but no {trace.MANIFEST}, so nothing shows "
                             "which command wrote them: use a new --out or --overwrite")
        return None
    stored = trace.read_json(path)
    why = resume_mismatch(stored, json.loads(json.dumps(current)))  # as stored: tuples become lists
    if why is not None:
        raise ValueError(f"--resume: {out} holds another run ({why}); resume it with its own command "
                         "(manifest.json 'command') or use a new --out")
    resumes = stored.get("resumes", []) + [{k: current[k] for k in ("created", "command", "git")}]
    return {**stored, "resumes": resumes}
