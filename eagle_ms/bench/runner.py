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
     with ``--verify-apart`` a third run times the fused step's verify apart (eagle_ms/bench/turn.py);
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

import numpy as np

from eagle_ms import trace
from eagle_ms.bench.datasets import Question, TurnSpec, dataset_path, expand_turns, load_questions, shard_turns
from eagle_ms.bench.distributed import job_id
from eagle_ms.bench.progress import Progress
from eagle_ms.bench.resume import finished_turns, resume_manifest
from eagle_ms.bench.turn import (BenchOptions, DrafterFactory, TurnRunner, answer_text, build_prompt,
                                 default_drafter)
from eagle_ms.locks import lock_dir
from eagle_ms.runtime import decode_mode, kernels_for

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
                "checkpoint": cfg.checkpoint, "draft_path": spec.draft_path,
                **({"verify_apart": True} if opts.verify_apart else {})},
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


# --- the run -----------------------------------------------------------------------------------

def _warm_up(session, prompt_ids: np.ndarray, factory: DrafterFactory, spec: TurnSpec, tokens: int,
             two_calls: bool) -> None:
    """Compile all graphs (``two_calls``: the two-call step's too), then one untimed baseline + EA pair of
    ``tokens`` new tokens (+ an untimed two-call run)."""
    session.warm_up(two_calls=two_calls)
    try:
        drafter = factory(session, prompt_ids, spec)
        session.untimed_pair(prompt_ids, drafter, tokens)
        if two_calls:
            session.run(prompt_ids, drafter, two_calls=True, max_new_tokens=tokens)
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
                _warm_up(session, prompt_ids, factory, spec, opts.warmup_tokens, opts.verify_apart)
                warmed = True
                progress.restart()  # the ETA should not count compilation
            header, steps = runner.run(spec, prompt_ids, skip)
            trace.write_turn_trace(opts.out, header, steps)
            progress.update(spec.key, _turn_note(header))
        base = header["baseline"]
        prev.append(answer_text(session, base["tokens"]) if base is not None else None)
        counts[header["status"]] += 1
        counts["mismatched"] += header["exact"] is False
    return counts
