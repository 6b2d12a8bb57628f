"""Regeneration under msrun (scripts/msrun_regenerate.sh) on CPU: 2 workers write the same bytes as one
process; a rerun of the finished job answers nothing and leaves the file as it was. (Rank filtering,
resume of a part, the merge and rank 0's wait are tested in-process in test_regenerate.py.)

The one-process reference runs in this process with the same YAML (random teacher weights from
runtime.seed); the msrun run is a subprocess (~20 s on 2 shared cores).
"""
import json
import os

import pytest

from conftest import REPO
from helpers_msrun import run_msrun, tiny_teacher_yaml
from eagle_ms.config import load_config
from eagle_ms.runtime import setup_context
from eagle_ms.train.regenerate import RegenOptions, run_regenerate

SCRIPT = os.path.join(REPO, "scripts", "msrun_regenerate.sh")
YAML = tiny_teacher_yaml("{seq_length: 96, prefill_chunk: 16, batch_size: 2, seed: 5}",
                         "generation: {max_new_tokens: 5}\n")
N_CONVERSATIONS = 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("regen_msrun")
    (root / "tiny.yaml").write_text(YAML)
    with open(root / "data.jsonl", "w", encoding="utf-8") as fh:
        for i in range(N_CONVERSATIONS):
            turns = [f"question {i} " * (1 + i % 3)] + (["and then?"] if i % 2 else [])
            conv = [m for t in turns for m in ({"from": "human", "value": t}, {"from": "gpt", "value": "old"})]
            fh.write(json.dumps({"id": f"c{i}", "conversations": conv}) + "\n")
    cfg = load_config(str(root / "tiny.yaml"))
    setup_context(cfg)
    run_regenerate(cfg, RegenOptions(out=str(root / "ref.jsonl"), data=str(root / "data.jsonl")), log=lambda m: None)
    return root


def _msrun(root, out):
    log_dir = root / f"logs-{len(os.listdir(root))}"
    return run_msrun(SCRIPT, root, log_dir, ["--config", str(root / "tiny.yaml"), "--data", str(root / "data.jsonl"),
                                             "--out", str(out), "--wait-timeout", "240"])


def test_two_workers_write_the_one_process_file(setup):
    root = setup
    out = root / "two.jsonl"
    proc, logs = _msrun(root, out)
    assert proc.returncode == 0, proc.stderr[-3000:] + "".join(logs.values())[-3000:]
    assert "nothing to do" in logs["scheduler.log"]  # msrun's scheduler process runs the command too
    assert "rank 1/2] wrote 2 conversations" in logs["worker_1.log"]
    assert "rank 0/2] wrote 3 conversations" in logs["worker_0.log"]
    assert open(out, "rb").read() == open(root / "ref.jsonl", "rb").read()
    assert sorted(n for n in os.listdir(root) if n.startswith("two.jsonl")) == ["two.jsonl", "two.jsonl.meta.json"]
    before = os.stat(out).st_size, open(out, "rb").read()
    proc, logs = _msrun(root, out)  # the finished job again: nothing to answer, same file
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wrote 0 conversations (3 already done)" in logs["worker_0.log"]
    assert (os.stat(out).st_size, open(out, "rb").read()) == before
