"""Regeneration under msrun (scripts/msrun_regenerate.sh) on CPU: 2 workers write the same bytes as one
process; a rerun of the finished job answers nothing and leaves the file as it was. (Rank filtering,
resume of a part, the merge and rank 0's wait are tested in-process in test_regenerate.py.)

The one-process reference runs in this process with the same YAML (random teacher weights from
runtime.seed); the msrun run is a subprocess (~20 s on 2 shared cores).
"""
import json
import os
import subprocess

import pytest

from conftest import REPO, free_port
from eagle_ms.config import load_config
from eagle_ms.runtime import setup_context
from eagle_ms.train.regenerate import RegenOptions, run_regenerate

SCRIPT = os.path.join(REPO, "scripts", "msrun_regenerate.sh")
TOKENIZER = os.path.join(REPO, "eagle_ms", "assets", "demo", "tokenizer.model")
YAML = f"""
model:
  model_config: {{vocab_size: 8000, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 3,
                 num_attention_heads: 4, num_key_value_heads: 2, eos_token_id: 4}}
  checkpoint: null
tokenizer: {{model_file: {TOKENIZER}, chat_template: openpangu}}
runtime: {{seq_length: 96, prefill_chunk: 16, batch_size: 2, seed: 5}}
generation: {{max_new_tokens: 5}}
"""
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
    cmd = ["bash", SCRIPT, "--workers", "2", "--master-port", str(free_port()), "--log-dir", str(log_dir), "--",
           "--config", str(root / "tiny.yaml"), "--data", str(root / "data.jsonl"), "--out", str(out),
           "--wait-timeout", "240"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    logs = {name: (log_dir / name).read_text(errors="replace") for name in os.listdir(log_dir)}
    return proc, logs


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
