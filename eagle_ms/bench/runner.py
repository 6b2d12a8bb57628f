"""``eagle-ms bench``: per turn, teacher-only and speculative decoding of the same prompt.

Both runs use the config's token choice: greedy, or position-keyed sampling with the same seed
(``generation.temperature`` > 0, eagle_ms/sampling.py), so at every temperature the exactness column
compares the speculative tokens with the teacher-only tokens of the same seed and must be all identical.

Protocol (one process, or one rank of many):
  0. take this rank's lock on the run directory (eagle_ms/locks.py), held to the end: a second writer
     of the rank, or any rank of another job, is refused before it writes anything;
  1. build the Session, compile every graph (``Session.warm_up``) and run one untimed warm-up pair
     (baseline + EA, ``warmup_tokens`` new tokens) on the first prompt, so no timed call compiles;
  2. for each of this rank's turns (``question_id % world_size == rank``): build the prompt, then run
     the baseline and the speculative decode back to back in the same process, alternating which goes
     first (turn index even: baseline first) so slow drift hits both alike; the drafter is built
     before its run and outside its timing (the test drafter needs a teacher-only pass to build);
  3. MT-Bench turn k > 1 is asked after the previous turns and the BASELINE's answers to them, so both
     runs of a turn see the identical prompt and the comparison is per identical prompt;
  4. write ``traces/<key>.jsonl``; on any exception or invariant failure write ``failures/`` and
     continue with the next turn; a mismatch between EA and baseline tokens is located and the
     teacher's logit margin there computed (a teacher forward over prompt + common prefix);
  5. write ``ranks/rank-<r>.json``; rank 0 waits (bounded) for every rank, then writes summary + plots.

Resume (``resume``): an interrupted run continues in the same directory. Each finished turn's trace
was written once, atomically, when the turn ended, so every trace present is a whole turn: those turns
are kept, not re-run, and the turn-2 prompts that need their baseline answers take them from the
traces. The run must be the same one: ``bench/resume.py`` compares the stored manifest with the one
this command would write (mode, config, turns, data files, world size) and names the first differing
key. A directory without a manifest starts a new run, so a sweep resumes point by point. Rank 0
appends the resuming command and git state to the manifest's ``resumes`` list.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from eagle_ms import trace
from eagle_ms.bench.datasets import (DEFAULT_DATASETS, Question, TurnSpec, dataset_path, expand_turns,
                                     load_questions, shard_turns)
from eagle_ms.bench.distributed import job_id
from eagle_ms.locks import lock_dir
from eagle_ms.metrics import first_divergence, logit_margin, speedup
from eagle_ms.bench.profile import MaskProfiler, NullProfiler
from eagle_ms.bench.progress import Progress
from eagle_ms.bench.resume import finished_turns, resume_manifest
from eagle_ms.runtime import decode_mode, kernels_for

DrafterFactory = Callable[[object, np.ndarray, TurnSpec], object]


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


def default_drafter(session, prompt_ids: np.ndarray, spec: TurnSpec):
    return session.make_drafter(prompt_ids)


# --- run directory -----------------------------------------------------------------------------

_RANK0_OUTPUTS = (trace.MANIFEST, "summary.json", "summary.md", "plots")


def prepare_run_dir(opts: BenchOptions, my_keys: list[str]) -> dict[str, dict]:
    """Make ``out`` ready for this rank; returns the headers of the turns kept for a resume, by key.

    Refuses to mix with an earlier run unless ``overwrite`` (which removes this rank's old files) or
    ``resume`` (which keeps this rank's finished traces and removes only its rank marker).
    """
    out = opts.out
    marker = trace.rank_marker_path(out, opts.rank)
    if opts.resume:
        if os.path.exists(marker):
            os.remove(marker)
        os.makedirs(os.path.join(out, trace.TRACES), exist_ok=True)
        return finished_turns(out, my_keys)
    stale = [p for p in ([os.path.join(out, trace.MANIFEST)] if opts.rank == 0 else []) + [marker]
             if os.path.exists(p)]
    stale += [trace.trace_path(out, k) for k in my_keys if os.path.exists(trace.trace_path(out, k))]
    if stale and not opts.overwrite:
        raise FileExistsError(f"{out} already holds a run ({stale[0]}): use a new --out, --resume or --overwrite")
    for path in stale:
        os.remove(path)
    if opts.rank == 0 and opts.overwrite:
        for name in _RANK0_OUTPUTS:
            path = os.path.join(out, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
        if opts.world_size == 1:  # alone: everything in the directory is ours
            for name in (trace.TRACES, trace.FAILURES, trace.RANKS):
                shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    os.makedirs(os.path.join(out, trace.TRACES), exist_ok=True)
    return {}


def build_manifest(cfg, session_mode: str, opts: BenchOptions, turns: list[TurnSpec]) -> dict:
    spec = cfg.speculative
    return {
        "kind": "bench",
        "command": opts.command,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "pid": os.getpid(),  # the process that ran rank 0's turns (a sweep runs each point in its own)
        "mode": session_mode,
        "profile": opts.profile,
        "run": {"draft": spec.draft, "step": spec.step, "kernels": kernels_for(cfg),
                "budget": spec.budget, "max_depth": spec.max_depth, "top_k": spec.top_k,
                "draft_window": spec.draft_window, "min_path_prob": spec.min_path_prob,
                "score_temperature": spec.score_temperature, "shallow_depth": spec.shallow_depth,
                "fallback_accept": spec.fallback_accept, "fallback_steps": spec.fallback_steps,
                "max_new_tokens": cfg.generation.max_new_tokens, "temperature": cfg.generation.temperature,
                "top_k_sample": cfg.generation.top_k, "top_p": cfg.generation.top_p, "seed": cfg.generation.seed,
                "datasets": list(opts.datasets), "limit": opts.limit, "config_file": cfg.source,
                "checkpoint": cfg.checkpoint, "draft_path": spec.draft_path},
        "world_size": opts.world_size,
        "shard_rule": "question_id % world_size == rank",
        "config": cfg.to_dict(),
        "versions": trace.package_versions(),
        "git": trace.git_info(),
        "env": trace.env_flags(),
        "device": trace.device_info(cfg.runtime.device_target),
        "data_files": trace.data_files(dataset_path(opts.data_dir, d) for d in opts.datasets),
        "turns": [{"key": t.key, "index": t.index, "rank": t.question_id % opts.world_size} for t in turns],
    }


# --- one turn ----------------------------------------------------------------------------------

def _answer_text(session, tokens: list[int]) -> str:
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

    def _one(self, phase: str, prompt_ids: np.ndarray, spec: TurnSpec):
        if phase == "baseline":
            return self.session.run(prompt_ids, run_dir=self.opts.out), None
        drafter = self.factory(self.session, prompt_ids, spec)
        with self.profiler.active() as prof:
            result = self.session.run(prompt_ids, drafter, run_dir=self.opts.out, on_step=prof.on_step)
        split = prof.per_step(len(result.steps))
        if self.opts.profile and split is None and not self._warned:
            self._warned = True
            print(f"warning: --profile could not attribute mask timings to steps on {spec.key} "
                  "(did the mask builders move?); the summary will have no 'mask' stage", file=sys.stderr)
        return result, split

    def run(self, spec: TurnSpec, prompt_ids: np.ndarray | None, skip_reason: str | None = None):
        """(header, steps): both runs of one turn; exceptions become failure dumps, never propagate."""
        order = ("baseline", "ea") if spec.index % 2 == 0 else ("ea", "baseline")
        header = {"key": spec.key, "dataset": spec.dataset, "question_id": spec.question_id, "turn": spec.turn,
                  "category": spec.category, "index": spec.index, "rank": self.opts.rank, "order": list(order),
                  "prompt_tokens": None if prompt_ids is None else int(prompt_ids.size),
                  "prompt_ids": None if prompt_ids is None else [int(x) for x in prompt_ids],
                  "status": "ok", "errors": [], "baseline": None, "ea": None,
                  "speedup": None, "exact": None, "mismatch": None}
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
        if len(results) < 2:
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


# --- the run -----------------------------------------------------------------------------------

def _warm_up(session, prompt_ids: np.ndarray, factory: DrafterFactory, spec: TurnSpec, tokens: int) -> None:
    """Compile all graphs, then one untimed baseline + EA pair of ``tokens`` new tokens."""
    session.warm_up()
    try:
        session.untimed_pair(prompt_ids, factory(session, prompt_ids, spec), tokens)
    except Exception as exc:  # noqa: BLE001 - the timed turn will fail again and be dumped there
        print(f"warning: warm-up on {spec.key} failed ({type(exc).__name__}: {exc}); graphs may compile "
              "during the first timed turn", file=sys.stderr)


def _turn_note(header: dict) -> str:
    if header["status"] != "ok":
        return header["status"].upper()
    sp = header["speedup"]
    return f"speedup {sp:.2f}x" + ("" if header["exact"] else "  MISMATCH") if sp is not None else ""


def run_bench(cfg, opts: BenchOptions, session=None, drafter_factory: DrafterFactory | None = None) -> dict | None:
    """Run this rank's turns into ``opts.out``; rank 0 also merges and returns the summary (else None).

    ``session``: reuse a built Session (left unchanged: per-call settings are overrides); ``drafter_factory``:
    (session, prompt_ids, turn) -> drafter, default ``session.make_drafter(prompt_ids)``. Rank r holds
    its lock on ``opts.out`` for the whole run (eagle_ms/locks.py): a second writer of the same rank, or
    a rank of another job, gets ``OutputInUseError`` before anything is written.
    """
    if cfg.speculative.draft == "none":
        raise ValueError("bench compares teacher-only with speculative decoding: set speculative.draft "
                         "(--draft test|eagle3)")
    if session is not None and session.cfg != cfg:
        raise ValueError("run_bench: the given session was built from another config")
    has_tokenizer = session.tokenizer is not None if session is not None else bool(cfg.tokenizer.model_file)
    if not has_tokenizer:
        raise ValueError("bench needs a tokenizer (tokenizer.model_file) to render the chat prompts")
    questions = load_questions(opts.data_dir, opts.datasets, opts.limit)
    with lock_dir(opts.out, opts.rank, opts.world_size, job_id()):  # one writer per rank, one job per run
        return _run_rank(cfg, opts, session, drafter_factory, questions)


def _run_rank(cfg, opts: BenchOptions, session, drafter_factory, questions: list[Question]) -> dict | None:
    """``run_bench`` once this rank holds its lock on the run directory."""
    from eagle_ms.bench.summary import write_report
    from eagle_ms.session import Session

    turns = expand_turns(questions)
    mine = shard_turns(turns, opts.rank, opts.world_size)
    keys = [t.key for t in mine]
    manifest = None  # rank 0 writes it; a resuming rank compares it with the stored one, before any write
    if opts.rank == 0 or opts.resume:
        manifest = build_manifest(cfg, session.mode if session is not None else decode_mode(cfg), opts, turns)
    resumed = resume_manifest(opts.out, manifest, keys) if opts.resume else None
    done = prepare_run_dir(opts, keys)
    if opts.resume and opts.progress:
        print(f"resume: {len(done)} of this rank's {len(mine)} turns already done in {opts.out}"
              if resumed is not None else f"resume: no run in {opts.out} yet, starting one", file=sys.stderr)
    t_start = time.monotonic()
    if opts.rank == 0:
        trace.write_json(os.path.join(opts.out, trace.MANIFEST), resumed or manifest)
    counts = {"turns": len(mine), "ok": 0, "failed": 0, "skipped": 0, "mismatched": 0, "error": None}
    try:  # the marker is written even when this rank dies, so rank 0 does not wait for it in vain
        session = session or Session(cfg)
        counts.update(_run_turns(session, questions, mine, opts, drafter_factory or default_drafter, done))
    except Exception as exc:  # noqa: BLE001 - recorded in the marker, then re-raised
        counts["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        trace.write_rank_marker(opts.out, opts.rank, {"world_size": opts.world_size, **counts,
                                                      "elapsed_s": time.monotonic() - t_start})
    if opts.rank != 0:
        return None
    missing = trace.wait_for_ranks(opts.out, opts.world_size, opts.merge_timeout_s)
    if missing:
        print(f"warning: ranks {missing} did not finish within {opts.merge_timeout_s:.0f}s; the summary "
              f"lists their turns as missing (rerun `eagle-ms report {opts.out}` when they are done)",
              file=sys.stderr)
    return write_report(opts.out)


def _run_turns(session, questions: list[Question], mine: list[TurnSpec], opts: BenchOptions,
               factory: DrafterFactory, done: dict[str, dict]) -> dict:
    """Run this rank's turns in order; ``done``: headers of turns kept from an interrupted run."""
    by_id = {(q.dataset, q.question_id): q for q in questions}
    runner = TurnRunner(session, opts, factory)
    label = f"[rank {opts.rank}] " if opts.world_size > 1 else ""
    progress = Progress(len(mine) - len(done), label=label, enabled=opts.progress)
    counts = {"ok": 0, "failed": 0, "skipped": 0, "mismatched": 0}
    answers: dict[tuple[str, int], list[str | None]] = {}
    warmed = False
    for spec in mine:
        q = by_id[(spec.dataset, spec.question_id)]
        prev = answers.setdefault((q.dataset, q.question_id), [])
        header = done.get(spec.key)
        if header is None:  # not kept from an interrupted run: run it now
            prompt_ids, skip = None, None
            if any(a is None for a in prev[:spec.turn - 1]):
                skip = f"turn {prev.index(None) + 1}'s baseline failed: its answer is needed for this prompt"
            else:
                prompt_ids = build_prompt(session, q, spec.turn, prev)
            if not warmed and prompt_ids is not None:
                _warm_up(session, prompt_ids, factory, spec, opts.warmup_tokens)
                warmed = True
                progress.restart()  # the ETA should not count compilation
            header, steps = runner.run(spec, prompt_ids, skip)
            trace.write_turn_trace(opts.out, header, steps)
            progress.update(spec.key, _turn_note(header))
        base = header["baseline"]
        prev.append(_answer_text(session, base["tokens"]) if base is not None else None)
        counts[header["status"]] += 1
        counts["mismatched"] += header["exact"] is False
    return counts
