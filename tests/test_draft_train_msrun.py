"""Data-parallel draft training under msrun (scripts/msrun_train_draft.sh) on CPU: 2 workers (gradients
all-reduced, loss counts all-reduced) give the same draft as 1 worker with the same global batch, within
fp32 tolerance, and the same held-out evaluation (evaluated in shares and all-reduced).

The 1-worker reference runs in this process with the same YAML; the msrun run is a subprocess (~30 s on
2 shared cores: scheduler + 2 workers import MindSpore, join the cluster and compile).
"""
import json
import os

import numpy as np
import pytest

from conftest import REPO
from helpers_msrun import run_msrun
from eagle_ms.config import load_config
from eagle_ms.draft_weights import load_draft_checkpoint, random_draft_state
from eagle_ms.train.draft_trainer import DraftTrainConfig, DraftTraining, draft_optim
from eagle_ms.safetensors_format import read_safetensors
from test_draft_trainer import MODEL, TOKENIZER, make_pipeline_data

SCRIPT = os.path.join(REPO, "scripts", "msrun_train_draft.sh")
STEPS, BATCH, TTT = 4, 4, 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("msrun_train")
    data = make_pipeline_data(str(root / "data"), n_conv=16)
    model = ", ".join(f"{k}: {v}" for k, v in MODEL.items())
    (root / "tiny.yaml").write_text(f"""
model:
  model_config: {{{model}}}
  checkpoint: {data["teacher"]}
tokenizer: {{model_file: {TOKENIZER}, chat_template: openpangu}}
runtime: {{seq_length: 96, prefill_chunk: 32}}
""")
    return root, data


def _args(data, out, work):
    return ["--data", data["features"], "--vocab", data["vocab"], "--out", str(out), "--work-dir", str(work),
            "--steps", str(STEPS), "--batch-size", str(BATCH), "--ttt-steps", str(TTT), "--holdout-every", "4",
            "--eval-every", "0", "--lr", "3e-3", "--warmup", "2", "--log-every", "1", "--seed", "5"]


def test_two_workers_equal_one_worker(setup):
    root, data = setup
    proc, logs = run_msrun(SCRIPT, root, root / "logs",
                           ["--config", str(root / "tiny.yaml"), *_args(data, root / "two", root / "w_two")])
    assert proc.returncode == 0, proc.stderr[-2000:] + logs.get("worker_1.log", "")[-2000:]
    assert "rank 1 of 2" in logs["worker_1.log"] and f"step {STEPS}/{STEPS}" in logs["worker_0.log"]

    cfg = load_config(str(root / "tiny.yaml"))
    one = DraftTraining(cfg, DraftTrainConfig(
        out=str(root / "one"), work_dir=str(root / "w_one"), data=data["features"], vocab=data["vocab"], steps=STEPS,
        batch_size=BATCH, ttt_steps=TTT, holdout_every=4, eval_every=0, log_every=1, seed=5,
        optim=draft_optim(lr=3e-3, warmup_steps=2, total_steps=STEPS)), log=lambda *_: None).run()

    a = read_safetensors(str(root / "one" / "model.safetensors"))
    b = read_safetensors(str(root / "two" / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=2e-6, err_msg=key)
    dcfg, _ = load_draft_checkpoint(str(root / "one"))
    init = random_draft_state(dcfg, 5, used_tokens=np.arange(dcfg.draft_vocab_size) + a["d2t"])
    assert np.max(np.abs(a["lm_head.weight"] - init["lm_head.weight"])) > 1e-3  # the run did train
    with open(root / "w_two" / "summary.json", encoding="utf-8") as fh:
        two = json.load(fh)
    losses_two = [loss for _, loss in two["history"]["train"]]
    with open(root / "w_one" / "summary.json", encoding="utf-8") as fh:
        losses_one = [loss for _, loss in json.load(fh)["history"]["train"]]
    np.testing.assert_allclose(losses_two, losses_one, rtol=1e-5)
    e1, e2 = one["eval"][1], two["eval"][1]
    assert e2["positions"] == e1["positions"] > 0
    assert e2["loss"] == pytest.approx(e1["loss"], rel=1e-5)
    np.testing.assert_allclose(e2["acc"], e1["acc"], atol=1e-6)
