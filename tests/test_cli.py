"""CLI tests: `eagle-ms generate ... --json` through the in-process entry point ``eagle_ms.cli.main`` (real
graph compile, real tokenizer). The process boundary itself (stdout holds only the answer, nothing is
left in the working directory) is tests/test_config_yaml.py's subprocess test."""
import contextlib
import io
import json
import os
from dataclasses import dataclass

import pytest

from eagle_ms.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "configs", "tiny.yaml")


@dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args) -> CliRun:
    """``eagle-ms *args`` in this process: exit code (an argparse exit counts as 2), stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=err)
    return CliRun(rc, out.getvalue(), err.getvalue())


def generate_json(*extra):
    proc = run_cli("generate", "--config", TINY, "--prompt", "Tell me about the sea.", "--max-new-tokens", "12",
                   "--json", *extra)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def baseline():
    return generate_json("--runtime-seed", "3")


def test_generate_json_fields(baseline):
    for key in ("prompt_tokens", "tokens", "text", "tokens_per_s", "verify_steps", "accepted_lengths", "tau",
                "stop_reason", "mode", "draft"):
        assert key in baseline, key
    assert baseline["draft"] == "none"
    assert 1 <= len(baseline["tokens"]) <= 12
    assert baseline["prompt_tokens"] > 5 and baseline["tokens_per_s"] > 0
    assert isinstance(baseline["text"], str)
    assert baseline["verify_steps"] == len(baseline["accepted_lengths"])
    assert all(a == 0 for a in baseline["accepted_lengths"])  # teacher-only: bonus token only


def test_generate_deterministic_for_seed_and_speculative_identical_prompt_checked_once(baseline, monkeypatch):
    import eagle_ms.teacher as teacher

    checks, real = [], teacher.check_token_ids
    monkeypatch.setattr(teacher, "check_token_ids", lambda ids, vocab, what="prompt": checks.append(what) or
                        real(ids, vocab, what))
    spec = generate_json("--runtime-seed", "3", "--draft", "test", "--budget", "8", "--max-depth", "4",
                         "--mode", "reference")
    assert checks.count("prompt") == 1  # Session.generate's check; its two prefills (test drafter) trust it
    assert spec["tokens"] == baseline["tokens"]  # same seed -> same random teacher -> same greedy output
    assert spec["draft"] == "test" and spec["mode"] == "reference"
    assert spec["tau"] >= 1.0 and spec["verify_steps"] <= baseline["verify_steps"]


def test_bad_override_is_a_clear_error():
    proc = run_cli("generate", "--config", TINY, "--prompt", "x", "--set", "runtime.seq_length=1")
    assert proc.returncode == 2
    assert "runtime.seq_length" in proc.stderr and "Traceback" not in proc.stderr


def test_prompt_longer_than_cache_is_a_clear_error():
    proc = run_cli("generate", "--config", TINY, "--prompt-ids", ",".join(["5"] * 600))
    assert proc.returncode == 2
    assert "does not fit the KV cache" in proc.stderr and "Traceback" not in proc.stderr


def test_fallback_flag_reaches_the_loop(baseline):
    # an unreachable bar: after the first speculative step every step of these 12 tokens is teacher-only
    spec = generate_json("--runtime-seed", "3", "--draft", "test", "--budget", "8", "--max-depth", "4",
                         "--fallback-accept", "inf")
    assert spec["tokens"] == baseline["tokens"]
    assert all(a == 0 for a in spec["accepted_lengths"][1:])
    proc = run_cli("generate", "--config", TINY, "--prompt", "x", "--fallback-accept", "-1")
    assert proc.returncode == 2
    assert "speculative.fallback_accept" in proc.stderr and "Traceback" not in proc.stderr
    # 'auto': Session.generate measures t_dec first (an untimed teacher-only run), so the bar is known
    auto = generate_json("--runtime-seed", "3", "--draft", "test", "--budget", "8", "--max-depth", "4",
                         "--fallback-accept", "auto")
    assert auto["tokens"] == baseline["tokens"] and 0 <= auto["fallback_bar"] < float("inf")
    proc = run_cli("generate", "--config", TINY, "--prompt", "x", "--fallback-accept", "often")
    assert proc.returncode == 2 and "'auto'" in proc.stderr and "Traceback" not in proc.stderr


def test_eagle3_fused_step_from_the_command_line_equals_teacher_only(tmp_path, baseline):
    """A random EAGLE-3 draft checkpoint through ``--step fused`` (draft + verify in one graph call per
    step), reference mode (every tree read back and checked): the teacher-only tokens. (``--step device``
    with an EAGLE-3 draft: tests/test_demo_pair.py, tests/test_device_loop.py.)"""
    from eagle_ms.config import load_config
    from eagle_ms.draft_weights import default_draft_config, random_draft_state, save_draft_checkpoint

    draft = default_draft_config(load_config(TINY).model)
    save_draft_checkpoint(random_draft_state(draft, 0, std=0.3), draft, str(tmp_path / "draft"))
    spec = generate_json("--runtime-seed", "3", "--draft", "eagle3", "--set",
                         f"speculative.draft_path={tmp_path}/draft", "--step", "fused", "--budget", "8", "--max-depth", "4", "--mode", "reference")
    assert spec["tokens"] == baseline["tokens"] and spec["draft"] == "eagle3" and spec["mode"] == "reference"
    assert spec["verify_steps"] <= baseline["verify_steps"]


def test_bench_profile_refuses_the_device_step(tmp_path):
    """--profile splits out host mask construction; the device step has none: a clear error, no run dir."""
    out = tmp_path / "run"
    proc = run_cli("bench", "--config", TINY, "--data-dir", str(tmp_path), "--out", str(out), "--profile",
                   "--step", "device")
    assert proc.returncode == 2 and "--profile" in proc.stderr and "--step host" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_bench_verify_apart_refuses_a_step_that_is_not_fused(tmp_path):
    """--verify-apart times a fused step's verify apart; any other step is a clear error, no run dir."""
    out = tmp_path / "run"
    proc = run_cli("bench", "--config", TINY, "--data-dir", str(tmp_path), "--out", str(out), "--verify-apart",
                   "--draft", "test", "--step", "device")
    assert proc.returncode == 2 and "--verify-apart" in proc.stderr and "--step fused" in proc.stderr
    assert "got step device" in proc.stderr and "Traceback" not in proc.stderr and not out.exists()


def test_decoding_flags_are_the_config_fields_they_set():
    import dataclasses

    from eagle_ms import cli_args
    from eagle_ms.cli import build_parser
    from eagle_ms.config import EagleMsConfig

    sections = {f.name: f.type for f in dataclasses.fields(EagleMsConfig)}
    for flag in cli_args.DECODE_FLAGS:
        section, field = flag.key.split(".")
        assert section in sections and field in {f.name for f in dataclasses.fields(
            cli_args._SECTIONS[section])}, flag.key
    parser = build_parser()
    for command in ("generate", "bench"):
        extra = ["--prompt", "x"] if command == "generate" else ["--data-dir", "d", "--out", "o"]
        args = parser.parse_args([command, *extra, "--budget", "8", "--min-path-prob", "0.25",
                                  "--draft-window", "none", "--mode", "reference"])
        assert cli_args.overrides(args) == {"speculative.budget": 8, "speculative.min_path_prob": 0.25,
                                            "speculative.draft_window": None, "speculative.mode": "reference"}
        assert cli_args.overrides(parser.parse_args([command, *extra])) == {}
        sampled = parser.parse_args([command, *extra, "--temperature", "0.9", "--top-p", "0.8", "--sample-top-k",
                                     "20", "--seed", "5", "--runtime-seed", "2", "--top-k", "3"])
        assert cli_args.overrides(sampled) == {"generation.temperature": 0.9, "generation.top_p": 0.8,
                                               "generation.top_k": 20, "generation.seed": 5, "runtime.seed": 2,
                                               "speculative.top_k": 3}
    regen = parser.parse_args(["regenerate", "--out", "o", "--temperature", "1.1", "--top-p", "0.7",
                               "--sample-top-k", "4", "--seed", "9"])  # the sampling flags only
    assert cli_args.overrides(regen) == {"generation.temperature": 1.1, "generation.top_p": 0.7,
                                         "generation.top_k": 4, "generation.seed": 9}


def test_default_config_outside_a_source_checkout_is_a_clear_error(tmp_path, monkeypatch):
    from eagle_ms import cli_args

    monkeypatch.setattr(cli_args, "DEFAULT_CONFIG", str(tmp_path / "configs" / "demo.yaml"))
    with pytest.raises(FileNotFoundError, match="pass --config"):
        cli_args.default_config()


@pytest.mark.parametrize("ids, message", [
    ("1,-5,3", "prompt token at position 1 is -5: outside the model vocabulary [0, 8000)"),
    ("1,2,8000", "prompt token at position 2 is 8000: outside the model vocabulary [0, 8000)"),
    ("", "--prompt-ids is empty: give comma-separated token ids"),
    (" , ", "--prompt-ids is empty"),
    ("1,x,3", "--prompt-ids item 1 is 'x': not an integer"),
])
def test_bad_prompt_ids_are_refused_naming_position_and_value(ids, message, capsys):
    assert main(["generate", "--config", TINY, "--prompt-ids", ids, "--max-new-tokens", "2", "--json"]) == 2
    out = capsys.readouterr()
    assert message in out.err and out.out == "" and "Traceback" not in out.err


def test_token_ids_are_checked_against_a_numpy_bound():
    import numpy as np

    from eagle_ms.token_ids import check_token_ids

    rng = np.random.default_rng(0)
    for _ in range(200):
        ids = rng.integers(-3, 40, size=rng.integers(1, 12))
        bad = np.flatnonzero((ids < 0) | (ids >= 32))
        if bad.size:
            with pytest.raises(ValueError, match=f"position {bad[0]} is {ids[bad[0]]}:"):
                check_token_ids(ids, 32)
        else:
            assert check_token_ids(ids, 32).tolist() == ids.tolist()
    with pytest.raises(ValueError, match="must be integers"):
        check_token_ids(np.array([1.5]), 32)


def test_an_os_error_naming_the_output_is_a_clear_error(tmp_path):
    """--out below a regular file (a location even root cannot write): one error line naming it, exit 2."""
    data = tmp_path / "regen.jsonl"
    data.write_text(json.dumps({"id": "a", "ids": [1, 2, 3], "assistant_mask": [0, 1, 1]}) + "\n")
    (tmp_path / "file").write_text("not a directory")
    out = tmp_path / "file" / "vocab.safetensors"
    proc = run_cli("build-vocab", "--data", str(data), "--draft-vocab-size", "2", "--vocab-size", "8",
                   "--out", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("eagle-ms build-vocab: error: [Errno 20] Not a directory")
    assert str(tmp_path / "file") in proc.stderr


def test_refused_checkpoints_are_clear_errors(tmp_path):
    """A checkpoint refused by the loaders (here: NaN in a teacher tensor, a draft config.json that is a
    list) is reported as `eagle-ms generate: error: ...` naming the file, without a traceback."""
    from eagle_ms.config import load_config
    from eagle_ms.draft_weights import default_draft_config, random_draft_state, save_draft_checkpoint
    from eagle_ms.weights import random_teacher_state, save_teacher_checkpoint

    model = load_config(TINY).model
    state = random_teacher_state(model, 0)
    state["model.norm.weight"][3] = float("nan")
    save_teacher_checkpoint(state, model, str(tmp_path / "teacher"))
    proc = run_cli("generate", "--config", TINY, "--prompt-ids", "5,6",
                   "--set", f"model.checkpoint={tmp_path}/teacher")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "eagle-ms generate: error:" in proc.stderr and "'model.norm.weight' holds 1 NaN/Inf" in proc.stderr
    assert str(tmp_path / "teacher" / "model.safetensors") in proc.stderr

    draft = default_draft_config(model)
    save_draft_checkpoint(random_draft_state(draft, 0), draft, str(tmp_path / "draft"))
    (tmp_path / "draft" / "config.json").write_text("[1, 2]")
    proc = run_cli("generate", "--config", TINY, "--prompt-ids", "5,6", "--draft", "eagle3",
                   "--set", f"speculative.draft_path={tmp_path}/draft")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{tmp_path}/draft/config.json: not a JSON object" in proc.stderr
