"""End-to-end benchmark runs on the tiny config with the test drafter (random weights, few tokens).

- a 4-turn smoke run through the CLI writes every file, with EA tokens equal to the baseline's and the
  MT-Bench turn-2 prompt built from the baseline's turn-1 answer (checked against the tokenizer);
- ``eagle-ms report`` reproduces the same summary from the traces;
- planted failures (a baseline crash, a corrupt draft tree, a changed EA token) land in failures/ or the
  mismatch list with the teacher's logit margin, and the run continues; a missing rank is reported;
- 2 msrun workers give the same tokens per turn (and the same merged summary counts) as 1 process;
- a 2-point sweep writes its table;
- one writer per run directory: a run (or sweep) into a directory another process writes is refused
  before it writes anything; an unwritable --out is a clear error; a failed summary write leaves no
  temp file and the previous summary;
- ``--step fused --verify-apart`` (random EAGLE-3 draft): each turn also runs the two-call step, which gives
  the fused run's tokens; every drafted step carries its two-call stages, and the summary has t_ver;
- an interrupted run resumes with `--resume`: finished turns are kept byte for byte, the rest give the
  same tokens as an uninterrupted run; a resume with another command is refused and changes nothing.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
from conftest import REPO, SHARED_DATA
from helpers_locks import held_elsewhere

import eagle_ms.tree
import eagle_ms.tree_checks
from eagle_ms import trace
from eagle_ms.bench.runner import BenchOptions, run_bench
from eagle_ms.cli import main
from eagle_ms.config import load_config
from eagle_ms.files import file_sha256
from eagle_ms.tree import DraftTree

pytestmark = pytest.mark.skipif(not os.path.isdir(SHARED_DATA), reason="shared data not present")

TINY = os.path.join(REPO, "configs", "tiny.yaml")
NEW = 8
SMOKE_KEYS = ["mt_bench-81-1", "mt_bench-81-2", "humaneval-0-1", "humaneval-1-1"]


def _bench_args(data_dir, out, *extra):
    return ["--config", TINY, "--data-dir", data_dir, "--datasets", "mt_bench,humaneval", "--limit", "2",
            "--draft", "test", "--max-new-tokens", str(NEW), "--warmup-tokens", "4", "--out", out, *extra]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """MT-Bench question 81 (2 turns) and HumanEval questions 0-2, copied from the shared data."""
    root = tmp_path_factory.mktemp("data")
    for name, n in (("mt_bench", 1), ("humaneval", 3)):
        (root / name).mkdir()
        with open(os.path.join(SHARED_DATA, name, "question.jsonl"), encoding="utf-8") as fh:
            lines = [next(fh) for _ in range(n)]
        (root / name / "question.jsonl").write_text("".join(lines), encoding="utf-8")
    return str(root)


@pytest.fixture(scope="module")
def smoke(data_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("smoke") / "run")
    assert main(["bench", *_bench_args(data_dir, out)]) == 0
    return out


@pytest.fixture(scope="module")
def session():
    from eagle_ms.session import Session

    cfg = load_config(TINY, {"speculative.draft": "test", "generation.max_new_tokens": NEW})
    return Session(cfg)


def test_smoke_run_writes_every_file(smoke, data_dir):
    files = {os.path.relpath(os.path.join(d, f), smoke) for d, _, fs in os.walk(smoke) for f in fs}
    assert {"manifest.json", "summary.json", "summary.md", "ranks/rank-0.json"} <= files
    assert {f"traces/{k}.jsonl" for k in SMOKE_KEYS} <= files
    assert {f"plots/{p}.png" for p in ("speedup_hist", "speedup_vs_accept", "accept_pos", "stages")} <= files
    man = trace.read_json(os.path.join(smoke, "manifest.json"))
    assert man["mode"] == "performance" and man["run"]["draft"] == "test" and man["world_size"] == 1
    assert man["config"]["generation"]["max_new_tokens"] == NEW and man["versions"]["mindspore"]
    assert "commit" in man["git"] and man["device"]["device_target"] == "CPU"
    assert [t["key"] for t in man["turns"]] == SMOKE_KEYS
    assert [d["sha256"] for d in man["data_files"]] == [
        file_sha256(os.path.join(data_dir, n, "question.jsonl")) for n in ("mt_bench", "humaneval")]
    assert "--max-new-tokens 8" in man["command"]
    s = trace.read_json(os.path.join(smoke, "summary.json"))
    assert s["turns"]["ok"] == 4 and s["exactness"]["share"] == 1.0 and s["ranks"]["missing"] == []
    for key in SMOKE_KEYS:
        header, steps = trace.read_turn_trace(trace.trace_path(smoke, key))
        assert header["ea"]["tokens"] == header["baseline"]["tokens"] and len(header["ea"]["tokens"]) == NEW
        assert header["order"] == (["baseline", "ea"] if header["index"] % 2 == 0 else ["ea", "baseline"])
        assert len(steps) == header["ea"]["verify_steps"] > 0
        emitted = sum(st["accepted_len"] + 1 for st in steps)
        assert emitted >= NEW  # the last step may emit past max_new_tokens (then truncated)
        for st in steps:
            assert len(st["accepted_path"]) == st["accepted_len"] + 1 and st["accepted_path"][0] == 0
            assert st["tree_nodes"] <= 16 and st["tree_depth"] <= 10
            assert {"draft", "tensorize", "verify", "accept", "commit"} <= set(st["stage_s"])


def test_turn2_prompt_uses_the_baseline_answer(smoke):
    from eagle_ms.tokenizer import Tokenizer, get_template

    cfg = load_config(TINY)
    tok, tmpl = Tokenizer(cfg.tokenizer.model_file), get_template("openpangu")
    q = json.loads(open(os.path.join(SHARED_DATA, "mt_bench", "question.jsonl")).readline())
    h1, _ = trace.read_turn_trace(trace.trace_path(smoke, "mt_bench-81-1"))
    h2, _ = trace.read_turn_trace(trace.trace_path(smoke, "mt_bench-81-2"))
    answer = h1["baseline"]["tokens"]
    answer = answer[:-1] if answer[-1] == cfg.model.eos_token_id else answer
    messages = [{"role": "user", "content": q["turns"][0]}, {"role": "assistant", "content": tok.decode(answer)},
                {"role": "user", "content": q["turns"][1]}]
    assert h2["prompt_ids"] == tmpl.encode_chat(tok, messages, True).ids
    assert h1["prompt_ids"] == tmpl.encode_chat(tok, messages[:1], True).ids


def test_report_reproduces_the_summary(smoke, capsys):
    before_json = open(os.path.join(smoke, "summary.json")).read()
    before_md = open(os.path.join(smoke, "summary.md")).read()
    for name in ("summary.json", "summary.md"):
        os.remove(os.path.join(smoke, name))
    shutil.rmtree(os.path.join(smoke, "plots"))
    assert main(["report", smoke]) == 0
    assert "4/4 turns ok" in capsys.readouterr().out
    assert open(os.path.join(smoke, "summary.json")).read() == before_json
    assert open(os.path.join(smoke, "summary.md")).read() == before_md
    assert os.path.exists(os.path.join(smoke, "plots", "stages.png"))
    assert main(["trace", "diff", smoke, smoke]) == 0


def _corrupting_factory(target_key):
    """The test drafter, but for ``target_key`` its 2nd tree has a parent after its child."""
    def factory(session, prompt_ids, spec):
        inner = session.make_drafter(prompt_ids)
        if spec.key != target_key:
            return inner
        calls = {"n": 0}
        propose = inner.propose

        def corrupt(root):
            tree = propose(root)
            calls["n"] += 1
            if calls["n"] == 2 and tree.num_nodes >= 2:
                parents = tree.parents.copy()
                parents[0] = 2  # node 1's parent is node 2: not before its child
                return DraftTree(tree.root_token, tree.tokens, parents, tree.scores)
            return tree
        inner.propose = corrupt
        return inner
    return factory


def test_planted_failures_are_dumped_and_the_run_continues(session, data_dir, tmp_path, monkeypatch):
    from eagle_ms.bench.datasets import load_questions
    from eagle_ms.bench.runner import build_prompt

    qs = {(q.dataset, q.question_id): q for q in load_questions(data_dir, ("mt_bench", "humaneval"), 3)}
    crash_prompt = tuple(build_prompt(session, qs[("mt_bench", 81)], 1, []).tolist())
    tamper_prompt = tuple(build_prompt(session, qs[("humaneval", 1)], 1, []).tolist())
    real_run, vocab = session.run, session.cfg.model.vocab_size

    def planted_run(prompt_ids, drafter=None, **overrides):
        key = tuple(int(x) for x in prompt_ids)
        if drafter is None and key == crash_prompt:
            raise RuntimeError("planted baseline crash")
        result = real_run(prompt_ids, drafter, **overrides)
        if drafter is not None and key == tamper_prompt:
            toks = list(result.tokens)
            toks[3] = (toks[3] + 1) % vocab
            result = dataclasses.replace(result, tokens=toks)
        return result
    monkeypatch.setattr(session, "run", planted_run)
    tree_mask, checks_mask = eagle_ms.tree.tree_mask, eagle_ms.tree_checks.tree_mask
    out = str(tmp_path / "run")
    opts = BenchOptions(data_dir=data_dir, out=out, limit=3, profile=True, progress=False, warmup_tokens=4)
    s = run_bench(session.cfg, opts, session=session, drafter_factory=_corrupting_factory("humaneval-0-1"))

    assert eagle_ms.tree.tree_mask is tree_mask and eagle_ms.tree_checks.tree_mask is checks_mask
    status = {p["key"]: p["status"] for p in s["per_turn"]}
    assert status == {"mt_bench-81-1": "failed", "mt_bench-81-2": "skipped", "humaneval-0-1": "failed",
                      "humaneval-1-1": "ok", "humaneval-2-1": "ok"}
    crash = trace.read_json(os.path.join(out, "failures", "mt_bench-81-1-baseline.json"))
    assert crash["error_type"] == "RuntimeError" and crash["prompt_ids"] == list(crash_prompt)
    tree = trace.read_json(os.path.join(out, "failures", "humaneval-0-1-ea.json"))
    assert tree["error_type"] == "TreeInvariantError" and tree["tree"]["parents"][0] == 2
    assert tree["phase"] == "ea" and tree["cache_length"] > 0 and tree["budget"] == 16
    h, _ = trace.read_turn_trace(trace.trace_path(out, "humaneval-0-1"))
    assert h["baseline"] is not None and h["ea"] is None and h["errors"][0]["dump"] == "failures/humaneval-0-1-ea.json"
    # the changed EA token: located, with the teacher's margin from a prefill over prompt + common prefix
    (mm,) = s["exactness"]["mismatches"]
    h, _ = trace.read_turn_trace(trace.trace_path(out, "humaneval-1-1"))
    base = h["baseline"]["tokens"]
    assert (mm["key"], mm["position"], mm["baseline_token"], mm["ea_token"]) == \
        ("humaneval-1-1", 3, base[3], (base[3] + 1) % vocab)
    logits = session.runner.prefill(np.array(list(tamper_prompt) + base[:3], np.int32)).logits[-1]
    top = np.sort(logits)[::-1]
    assert mm["top1"] == base[3] and mm["margin"] == pytest.approx(float(top[0] - top[1]), rel=1e-5)
    assert mm["gap"] == pytest.approx(float(logits[base[3]] - logits[mm["ea_token"]]), rel=1e-5) and mm["gap"] > 0
    assert s["exactness"]["identical"] == 1 and s["turns"]["ok"] == 2
    assert "mask" in s["stages"] and s["run"]["profile"] is True
    md = open(os.path.join(out, "summary.md")).read()
    assert "## Failures" in md and "planted baseline crash" in md and "PROFILE RUN" in md


def test_profile_times_the_tree_and_verify_masks_of_every_step(session, data_dir, tmp_path):
    out = str(tmp_path / "profile")
    opts = BenchOptions(data_dir=data_dir, out=out, datasets=("humaneval",), limit=2, profile=True, progress=False,
                        warmup_tokens=4)
    s = run_bench(session.cfg, opts, session=session)
    steps = [st for _, sts in trace.read_traces(out) for st in sts]
    assert steps and all("profile_s" in st for st in steps), "a profile run lost its mask events"
    for st in steps:
        prof, stages = st["profile_s"], st["stage_s"]
        assert prof["mask_verify_s"] == stages["mask"] > 0  # the verify mask: the loop's own lap
        assert 0 < prof["mask_tree_s"] < stages["tensorize"]  # the tree mask is built inside tensorize
    want = np.mean([st["stage_s"]["mask"] + st["profile_s"]["mask_tree_s"] for st in steps])
    assert s["stages"]["mask"]["mean_ms"] == pytest.approx(1e3 * want)
    want = np.mean([st["stage_s"]["tensorize"] - st["profile_s"]["mask_tree_s"] for st in steps])
    assert s["stages"]["tensorize"]["mean_ms"] == pytest.approx(1e3 * want)


def test_missing_rank_is_reported_not_waited_for(session, data_dir, tmp_path):
    out = str(tmp_path / "rank0-only")
    opts = BenchOptions(data_dir=data_dir, out=out, limit=2, progress=False, warmup_tokens=4, rank=0,
                        world_size=2, merge_timeout_s=0.5)
    s = run_bench(session.cfg, opts, session=session)
    assert s["ranks"]["missing"] == [1]
    assert s["turns"]["missing"] == ["mt_bench-81-1", "mt_bench-81-2", "humaneval-1-1"]
    assert s["turns"]["ok"] == 1 and "Ranks missing" in open(os.path.join(out, "summary.md")).read()
    with pytest.raises(FileExistsError, match="--overwrite"):
        run_bench(session.cfg, opts, session=session)


def test_two_msrun_workers_match_one_process(smoke, data_dir, tmp_path):
    """...and a 2-worker run that lost one turn of each rank resumes under msrun to the same tokens."""
    out = str(tmp_path / "msrun")
    env = dict(os.environ, GLOG_v="3")

    def msrun_bench(*extra):
        proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "msrun_bench.sh"), "2", "bench",
                               *_bench_args(data_dir, out, "--no-progress", "--merge-timeout", "120", *extra)],
                              capture_output=True, text=True, timeout=400, env=env, cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    msrun_bench()
    lost = ["mt_bench-81-2", "humaneval-0-1"]  # one turn of each rank
    assert {trace.read_turn_trace(trace.trace_path(out, k))[0]["rank"] for k in lost} == {0, 1}
    for key in lost:
        os.remove(trace.trace_path(out, key))
    msrun_bench("--resume")
    assert sorted(os.listdir(os.path.join(out, "ranks"))) == ["rank-0.json", "rank-1.json"]
    ranks = {trace.read_turn_trace(trace.trace_path(out, k))[0]["rank"] for k in SMOKE_KEYS}
    assert ranks == {0, 1}
    for key in SMOKE_KEYS:
        one, _ = trace.read_turn_trace(trace.trace_path(smoke, key))
        two, _ = trace.read_turn_trace(trace.trace_path(out, key))
        assert two["prompt_ids"] == one["prompt_ids"]
        assert two["baseline"]["tokens"] == one["baseline"]["tokens"]
        assert two["ea"]["tokens"] == one["ea"]["tokens"]
    merged, single = (trace.read_json(os.path.join(d, "summary.json")) for d in (out, smoke))
    assert merged["turns"] == single["turns"] and merged["exactness"] == single["exactness"]
    assert merged["run"]["world_size"] == 2 and merged["ranks"]["missing"] == []
    assert len(trace.read_json(os.path.join(out, "manifest.json"))["resumes"]) == 1
    assert [t["n_tokens"] for t in merged["per_turn"]] == [t["n_tokens"] for t in single["per_turn"]]


def test_sampled_bench_compares_seeded_runs(smoke, data_dir, tmp_path):
    """At T > 0 both runs of a turn sample with the same seed: every turn exact, the answers differ from
    the greedy run's, and the manifest and summary name the sampling."""
    out = str(tmp_path / "sampled")
    sampled = ["--temperature", "1.0", "--top-p", "0.9", "--sample-top-k", "30", "--seed", "3"]
    one = ["--datasets", "mt_bench", "--limit", "1"]  # both turns of question 81 (turn 2 after the sampled answer)
    assert main(["bench", *_bench_args(data_dir, out, *sampled, *one), "--strict", "--no-progress"]) == 0
    summary = trace.read_json(os.path.join(out, "summary.json"))
    assert summary["exactness"]["identical"] == summary["turns"]["ok"] == 2
    run = trace.read_json(os.path.join(out, "manifest.json"))["run"]
    assert (run["temperature"], run["top_p"], run["top_k_sample"], run["seed"]) == (1.0, 0.9, 30, 3)
    assert "sampled T=1.0 top_k=30 top_p=0.9 seed=3" in open(os.path.join(out, "summary.md")).read()
    greedy = {h["key"]: h["baseline"]["tokens"] for h, _ in trace.read_traces(smoke)}
    mine = {h["key"]: h["baseline"]["tokens"] for h, _ in trace.read_traces(out)}
    assert sorted(mine) == ["mt_bench-81-1", "mt_bench-81-2"] and mine["mt_bench-81-1"] != greedy["mt_bench-81-1"]


def test_sweep_cli_two_budgets(data_dir, tmp_path, capsys):
    out = str(tmp_path / "sweep")
    args = ["sweep", "--config", TINY, "--data-dir", data_dir, "--datasets", "humaneval", "--limit", "1",
            "--draft", "test", "--max-new-tokens", "4", "--warmup-tokens", "2", "--no-progress",
            "--budgets", "4,8", "--max-depth", "3", "--out", out]
    assert main(args) == 0
    data = trace.read_json(os.path.join(out, "sweep.json"))
    (result,) = data["results"]
    assert result["axis"] == "budget" and [r["name"] for r in result["rows"]] == ["M4-D3-Wnone", "M8-D3-Wnone"]
    assert all(r["turns_ok"] == 1 and r["exactness"] == 1.0 for r in result["rows"])
    man = trace.read_json(os.path.join(out, "points", "M8-D3-Wnone", "manifest.json"))
    assert man["run"]["budget"] == 8 and man["run"]["max_depth"] == 3
    # each point ran in its own process (earlier points' graphs slowed later points in a shared one)
    pids = {trace.read_json(os.path.join(out, "points", p, "manifest.json"))["pid"] for p in ("M4-D3-Wnone", "M8-D3-Wnone")}
    assert len(pids) == 2 and os.getpid() not in pids
    assert "| M4-D3-Wnone | 4 | 3 | none | 1 |" in open(os.path.join(out, "sweep.md")).read()
    assert main(["report", out]) == 0
    assert os.path.exists(os.path.join(out, "plots", "sweep_budget.png"))
    # interrupted before its second point: --resume keeps the first point's turn, runs the second
    first = trace.trace_path(os.path.join(out, "points", "M4-D3-Wnone"), "humaneval-0-1")
    kept = open(first, "rb").read()
    shutil.rmtree(os.path.join(out, "points", "M8-D3-Wnone"))
    assert main([*args, "--resume"]) == 0
    assert open(first, "rb").read() == kept
    rows = trace.read_json(os.path.join(out, "sweep.json"))["results"][0]["rows"]
    assert [r["turns_ok"] for r in rows] == [1, 1]
    # a point's error, raised in its process, is this command's error (message, exit code 2)
    other = list(args)
    other[other.index("--max-new-tokens") + 1] = "5"
    assert main([*other, "--resume"]) == 2
    assert "(config.generation.max_new_tokens: the run has 4, this command 5)" in capsys.readouterr().err


def test_a_run_dir_another_process_writes_is_refused_before_anything_is_written(data_dir, tmp_path, capsys):
    out = str(tmp_path / "busy")
    # the same rank of another run, then a rank of another job (a 2-worker run): both refused, nothing written
    for rank, world in ((0, 1), (1, 2)):
        with held_elsewhere("dir", out, rank=rank, world=world) as pid:
            assert main(["bench", *_bench_args(data_dir, out)]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"eagle-ms bench: error: {out} is being written by another") and f"pid {pid}" in err
            assert os.listdir(out) == [f".lock-rank-{rank}"]
    sweep = str(tmp_path / "busy_sweep")
    with held_elsewhere("dir", sweep) as pid:
        assert main(["sweep", *_bench_args(data_dir, sweep), "--budgets", "4,8"]) == 2
        assert f"{sweep} is being written by another process (pid {pid}" in capsys.readouterr().err
        assert os.listdir(sweep) == [".lock-rank-0"]


def test_an_unwritable_run_dir_is_a_clear_error(data_dir, tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")  # below a regular file: not writable, even for root
    out = str(tmp_path / "file" / "run")
    assert main(["bench", *_bench_args(data_dir, out)]) == 2
    assert capsys.readouterr().err.startswith(f"eagle-ms bench: error: [Errno 20] Not a directory: '{out}'")


def test_a_failed_summary_write_leaves_no_temp_file_and_the_old_summary(smoke, tmp_path, monkeypatch):
    import eagle_ms.bench.summary as summary

    run = str(tmp_path / "copy")
    shutil.copytree(smoke, run)
    before = {name: open(os.path.join(run, name), "rb").read() for name in ("summary.json", "summary.md")}
    real = summary.summarize
    monkeypatch.setattr(summary, "summarize", lambda d: {**real(d), "unserialisable": object()})
    with pytest.raises(TypeError):  # json.dump fails half-way through summary.json
        summary.write_report(run, plots=False)
    monkeypatch.setattr(summary, "summarize", real)
    monkeypatch.setattr(summary, "render_markdown", lambda s: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # summary.md fails after its file was opened
        summary.write_report(run, plots=False)
    left = [os.path.join(d, f) for d, _, fs in os.walk(run) for f in fs if ".tmp" in f]
    assert left == []
    assert {name: open(os.path.join(run, name), "rb").read() for name in before} == before


def _interrupted_copy(smoke: str, run: str, unfinished: list[str]) -> None:
    """``smoke`` as a run killed before ``unfinished`` ended: no traces for them, no summary or rank
    marker, and the dead process's lock file left behind (the OS dropped its flock)."""
    shutil.copytree(smoke, run)
    for key in unfinished:
        os.remove(trace.trace_path(run, key))
    for name in ("summary.json", "summary.md", os.path.join("ranks", "rank-0.json")):
        os.remove(os.path.join(run, name))
    shutil.rmtree(os.path.join(run, "plots"))
    with open(os.path.join(run, ".lock-rank-0"), "w") as fh:
        json.dump({"pid": 999999, "host": "gone", "rank": 0, "world": 1, "job": None, "since": 0}, fh)


def test_an_interrupted_run_resumes_with_its_finished_turns_kept(smoke, data_dir, tmp_path):
    run = str(tmp_path / "run")
    unfinished = ["mt_bench-81-2", "humaneval-1-1"]  # turn 2 needs turn 1's baseline answer from its trace
    _interrupted_copy(smoke, run, unfinished)
    kept = {k: open(trace.trace_path(run, k), "rb").read() for k in SMOKE_KEYS if k not in unfinished}
    assert main(["bench", *_bench_args(data_dir, run)]) == 2  # without --resume the run is refused
    assert main(["bench", *_bench_args(data_dir, run), "--resume"]) == 0
    for key in SMOKE_KEYS:
        if key in kept:  # not re-run
            assert open(trace.trace_path(run, key), "rb").read() == kept[key]
        mine, _ = trace.read_turn_trace(trace.trace_path(run, key))
        ref, _ = trace.read_turn_trace(trace.trace_path(smoke, key))
        assert mine["prompt_ids"] == ref["prompt_ids"] and mine["baseline"]["tokens"] == ref["baseline"]["tokens"]
        assert mine["ea"]["tokens"] == mine["baseline"]["tokens"]
    s = trace.read_json(os.path.join(run, "summary.json"))
    assert s["turns"]["ok"] == 4 and s["exactness"]["identical"] == 4
    assert trace.read_json(os.path.join(run, "ranks", "rank-0.json"))["ok"] == 4
    man, first = trace.read_json(os.path.join(run, "manifest.json")), trace.read_json(os.path.join(smoke, "manifest.json"))
    assert man["created"] == first["created"] and man["command"] == first["command"]
    assert len(man["resumes"]) == 1 and " --resume " in man["resumes"][0]["command"]


def test_a_resume_with_another_command_is_refused_and_changes_nothing(smoke, data_dir, tmp_path, capsys):
    run = str(tmp_path / "run")
    _interrupted_copy(smoke, run, ["humaneval-1-1"])
    def files():  # the stale lock file goes with any writer that takes the lock; everything else must stay
        return {os.path.join(d, f): open(os.path.join(d, f), "rb").read() for d, _, fs in os.walk(run) for f in fs
                if not f.startswith(".lock")}
    before = files()
    args = _bench_args(data_dir, run, "--resume")
    args[args.index("--max-new-tokens") + 1] = str(NEW + 1)
    assert main(["bench", *args]) == 2
    assert ("holds another run (config.generation.max_new_tokens: the run has 8, this command 9)"
            in capsys.readouterr().err)
    assert files() == before
    os.remove(os.path.join(run, "manifest.json"))  # traces whose command is unknown are not adopted
    assert main(["bench", *_bench_args(data_dir, run, "--resume")]) == 2
    assert "holds turn traces but no manifest.json" in capsys.readouterr().err
    assert files() == {k: v for k, v in before.items() if not k.endswith("manifest.json")}
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *_bench_args(data_dir, run, "--resume", "--overwrite")])
    assert exit_info.value.code == 2
    assert "--resume keeps the run in --out and --overwrite replaces it" in capsys.readouterr().err


def test_verify_apart_times_the_fused_runs_verify_on_the_same_steps(data_dir, tmp_path):
    from eagle_ms.draft_weights import default_draft_config, random_draft_state, save_draft_checkpoint

    draft = default_draft_config(load_config(TINY).model)
    save_draft_checkpoint(random_draft_state(draft, 0, std=0.3), draft, str(tmp_path / "draft"))
    out = str(tmp_path / "run")
    args = ["--config", TINY, "--data-dir", data_dir, "--datasets", "humaneval", "--limit", "2", "--draft", "eagle3",
            "--set", f"speculative.draft_path={tmp_path}/draft", "--step", "fused", "--verify-apart", "--budget", "8",
            "--max-depth", "4", "--max-new-tokens", "16", "--warmup-tokens", "4", "--out", out]
    assert main(["bench", *args]) == 0
    traces = trace.read_traces(out)
    assert len(traces) == 2
    for h, steps in traces:
        assert h["status"] == "ok" and h["exact"], h["errors"]
        even = h["index"] % 2 == 0
        assert h["order"] == (["baseline", "ea", "ea_two_calls"] if even else ["ea_two_calls", "ea", "baseline"])
        assert h["ea_two_calls"]["same_tokens"] and h["ea_two_calls"]["tokens_per_s"] > 0
        drafted = [s for s in steps if s["tree_nodes"] > 0]
        assert drafted
        for s in drafted:
            assert "draft_verify" in s["stage_s"] and "verify" not in s["stage_s"]
            assert {"draft", "verify"} <= set(s["two_calls_stage_s"])
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    assert summary["run"]["verify_apart"] is True
    assert summary["costs"]["t_ver_ms"] > 0 and summary["costs"]["efficiency"] > 0
    assert summary["two_calls"]["turns"] == summary["two_calls"]["same_tokens"] == 2
