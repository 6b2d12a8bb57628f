"""One turn of ``eagle-ms bench`` (eagle_ms/bench/runner.py runs the turns): the teacher-only and the
speculative run of one prompt, back to back in one process, and their trace records.

Order: turn index even runs the baseline first, odd the speculative run first, so slow drift hits both
alike. With ``BenchOptions.verify_apart`` (``--verify-apart``, for ``speculative.step: fused``) a third
run decodes the same prompt with the same draft as the two-call device step (draft graph, then verify
graph: eagle_ms/device_step.py), last on even turns and first on odd ones. It draws the same trees and
accepts the same paths as the fused run (its tokens are checked), so its ``verify`` stage, step by step,
is the verify forward of the fused run's steps timed apart: the t_ver that the efficiency and the
overhead of a fused run need (eagle_ms/bench/summary.py, docs/metrics.md). Its own tokens/s is recorded
too, so the fused and the two-call step are compared on every turn of the run.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

from eagle_ms import trace
from eagle_ms.bench.datasets import DEFAULT_DATASETS, Question, TurnSpec
from eagle_ms.bench.profile import MaskProfiler, NullProfiler
from eagle_ms.metrics import first_divergence, logit_margin, speedup

DrafterFactory = Callable[[object, np.ndarray, TurnSpec], object]
TWO_CALLS = "ea_two_calls"  # the phase (and header key) of the --verify-apart run


@dataclass(frozen=True)
class BenchOptions:
    data_dir: str
    out: str
    datasets: tuple[str, ...] = DEFAULT_DATASETS
    limit: int | None = None  # first N questions of each dataset
    profile: bool = False  # finer stage split (mask); not for headline numbers
    progress: bool = True
    overwrite: bool = False
    merge_timeout_s: float = 1800.0  # rank 0's bounded wait for the other ranks
    warmup_tokens: int = 8
    resume: bool = False  # keep the finished turns of an interrupted run in ``out``, run the rest
    rank: int = 0
    world_size: int = 1
    command: str | None = None  # the command line, for the manifest and summary.md
    verify_apart: bool = False  # fused step: also run each turn as two graph calls, verify timed apart (module doc)


def default_drafter(session, prompt_ids: np.ndarray, spec: TurnSpec):
    return session.make_drafter(prompt_ids)

# --- one turn ----------------------------------------------------------------------------------

def answer_text(session, tokens: list[int]) -> str:
    """The baseline's answer as text for the next turn's prompt (trailing EOS dropped)."""
    eos = session.cfg.model.eos_token_id
    ids = tokens[:-1] if tokens and tokens[-1] == eos else tokens
    return session.tokenizer.decode(ids)


def build_prompt(session, question: Question, turn: int, answers: list[str]) -> np.ndarray:
    """Chat ids of turn ``turn`` (1-based): previous user turns with the baseline's answers, then this one."""
    messages = []
    for k in range(turn - 1):
        messages += [{"role": "user", "content": question.turns[k]}, {"role": "assistant", "content": answers[k]}]
    messages.append({"role": "user", "content": question.turns[turn - 1]})
    return np.asarray(session.template.encode_chat(session.tokenizer, messages, True).ids, dtype=np.int32)


def _run_record(result, ea: bool) -> dict:
    rec = {"tokens": [int(t) for t in result.tokens], "n_tokens": len(result.tokens), "total_s": result.total_s,
           "prefill_s": result.prefill_s, "tokens_per_s": result.tokens_per_s, "stop_reason": result.stop_reason,
           "verify_steps": result.verify_steps}
    if ea:
        rec["tau"] = result.tau
        rec["fallback_bar"] = result.fallback_bar
    return rec


def _step_records(result, profile_steps: list[dict] | None) -> list[dict]:
    out = []
    for i, s in enumerate(result.steps):
        rec = {"i": i, "tree_nodes": s.tree_nodes, "tree_depth": s.tree_depth, "accepted_len": s.accepted_len,
               "accepted_path": list(s.accepted_path), "reorder_copy": bool(s.reorder_copy),
               "stage_s": dict(s.stage_s)}
        if profile_steps is not None:
            rec["profile_s"] = profile_steps[i]
        out.append(rec)
    return out


def _two_calls_record(two_calls, fused, steps: list[dict]) -> dict:
    """The --verify-apart run's record (tokens/s, stop reason; its tokens only as ``same_tokens``, whether
    they equal the fused run's). When they do and every step accepted as many drafts, each of the fused
    run's step records gets the two-call step's stages of the same step as ``two_calls_stage_s``."""
    rec = _run_record(two_calls, ea=True)
    rec["same_tokens"] = rec.pop("tokens") == [int(t) for t in fused.tokens]
    if rec["same_tokens"] and [s.accepted_len for s in two_calls.steps] == [r["accepted_len"] for r in steps]:
        for record, step in zip(steps, two_calls.steps):
            record["two_calls_stage_s"] = dict(step.stage_s)
    return rec


def _mismatch(session, prompt_ids: np.ndarray, base: list[int], ea: list[int]) -> dict:
    """First differing position and the teacher's logit margin there (prefill over prompt + common prefix)."""
    pos = first_divergence(base, ea)
    info = {"position": pos, "baseline_token": base[pos] if pos < len(base) else None,
            "ea_token": ea[pos] if pos < len(ea) else None}
    context = np.concatenate([prompt_ids, np.asarray(base[:pos], np.int32)])
    try:
        logits = session.runner.prefill(context).logits[-1]
        info.update(logit_margin(logits, info["baseline_token"], info["ea_token"]))
    except ValueError as exc:  # context does not fit a prefill near capacity
        info.update(margin=None, margin_error=str(exc))
    return info


class TurnRunner:
    """Runs turns on one Session; knows where failures go and which profiler to use."""

    def __init__(self, session, opts: BenchOptions, drafter_factory: DrafterFactory | None = None):
        self.session = session
        self.opts = opts
        self.factory = drafter_factory or default_drafter
        self.profiler = MaskProfiler() if opts.profile else NullProfiler()
        self._warned = False

    def _context(self, spec: TurnSpec, prompt_ids) -> dict:
        return {"dataset": spec.dataset, "question_id": spec.question_id, "turn": spec.turn,
                "rank": self.opts.rank, "prompt_ids": [int(x) for x in prompt_ids],
                "cache_length": int(self.session.runner.length), "budget": self.session.settings.budget,
                "max_depth": self.session.settings.max_depth}

    def _fail(self, header: dict, spec: TurnSpec, phase: str, exc: Exception, prompt_ids) -> None:
        path = trace.write_failure(self.opts.out, spec.key, phase, exc, self._context(spec, prompt_ids))
        header["errors"].append({"phase": phase, "error_type": type(exc).__name__, "message": str(exc)[:500],
                                 "dump": os.path.relpath(path, self.opts.out)})

    def _order(self, spec: TurnSpec) -> tuple[str, ...]:
        """The phases of a turn in the order they run (module doc)."""
        even = spec.index % 2 == 0
        pair = ("baseline", "ea") if even else ("ea", "baseline")
        if not self.opts.verify_apart:
            return pair
        return pair + (TWO_CALLS,) if even else (TWO_CALLS,) + pair

    def _one(self, phase: str, prompt_ids: np.ndarray, spec: TurnSpec):
        if phase == "baseline":
            return self.session.run(prompt_ids, run_dir=self.opts.out), None
        drafter = self.factory(self.session, prompt_ids, spec)
        if phase == TWO_CALLS:
            return self.session.run(prompt_ids, drafter, two_calls=True, run_dir=self.opts.out), None
        with self.profiler.active() as prof:
            result = self.session.run(prompt_ids, drafter, run_dir=self.opts.out, on_step=prof.on_step)
        split = prof.per_step(len(result.steps))
        if self.opts.profile and split is None and not self._warned:
            self._warned = True
            print(f"warning: --profile could not attribute mask timings to steps on {spec.key} "
                  "(did the mask builders move?); the summary will have no 'mask' stage", file=sys.stderr)
        return result, split

    def run(self, spec: TurnSpec, prompt_ids: np.ndarray | None, skip_reason: str | None = None):
        """(header, steps): the runs of one turn (module doc); exceptions become failure dumps, never
        propagate, and a turn with a failed run is ``failed``."""
        order = self._order(spec)
        header = {"key": spec.key, "dataset": spec.dataset, "question_id": spec.question_id, "turn": spec.turn,
                  "category": spec.category, "index": spec.index, "rank": self.opts.rank, "order": list(order),
                  "prompt_tokens": None if prompt_ids is None else int(prompt_ids.size),
                  "prompt_ids": None if prompt_ids is None else [int(x) for x in prompt_ids],
                  "status": "ok", "errors": [], "baseline": None, "ea": None,
                  "speedup": None, "exact": None, "mismatch": None}
        if self.opts.verify_apart:
            header[TWO_CALLS] = None
        if prompt_ids is None:
            header["status"] = "skipped"
            header["errors"].append({"phase": "prompt", "error_type": "Skipped", "message": skip_reason})
            return header, []
        try:
            self.session.runner.check_prompt_fits(int(prompt_ids.size))
        except ValueError as exc:
            self._fail(header, spec, "prompt", exc, prompt_ids)
            header["status"] = "failed"
            return header, []
        results, profile_steps = {}, None
        for phase in order:
            try:
                results[phase], prof = self._one(phase, prompt_ids, spec)
                profile_steps = prof if phase == "ea" else profile_steps
            except Exception as exc:  # noqa: BLE001 - any failure of one turn is dumped; the run goes on
                self._fail(header, spec, phase, exc, prompt_ids)
        steps = []
        if "baseline" in results:
            header["baseline"] = _run_record(results["baseline"], ea=False)
        if "ea" in results:
            header["ea"] = _run_record(results["ea"], ea=True)
            steps = _step_records(results["ea"], profile_steps)
            if TWO_CALLS in results:
                header[TWO_CALLS] = _two_calls_record(results[TWO_CALLS], results["ea"], steps)
        if len(results) < len(order):
            header["status"] = "failed"
            return header, steps
        base, ea = header["baseline"]["tokens"], header["ea"]["tokens"]
        header["speedup"] = speedup(header["ea"]["tokens_per_s"], header["baseline"]["tokens_per_s"])
        header["exact"] = base == ea
        if not header["exact"]:
            try:
                header["mismatch"] = _mismatch(self.session, prompt_ids, base, ea)
            except Exception as exc:  # noqa: BLE001 - the margin is diagnostic; never lose the turn
                self._fail(header, spec, "mismatch", exc, prompt_ids)
        return header, steps
