"""Issue 13 teacher tooling: held-out loss by position band (band_losses, scripts/eval_teacher_bands.py) vs a
NumPy float64 cross entropy, and training initialised from an existing checkpoint (``init_from``)."""
import dataclasses
import importlib.util
import json
import os

import numpy as np
import pytest

from eagle_ms.config import load_config
from eagle_ms.models.pangu import PanguForCausalLM
from eagle_ms.train.checkpoint import latest_step
from eagle_ms.train.optim import OptimConfig
from eagle_ms.models.training import CausalLMTokenLoss
from eagle_ms.train.teacher_lm import LMTrainConfig, band_losses, train_lm
from eagle_ms.weights import CheckpointError, load_state, model_state, random_teacher_state, save_teacher_checkpoint
from helpers_models import TINY
from numpy_reference import reference_forward

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ, BAND = 16, 4


def _numpy_bands(cfg, state, stream, seq, band, windows):
    """Second implementation: fp64 forward per window, cross entropy per position, mean per band."""
    ce = []
    for j in range(windows):
        w = stream[j * seq:j * seq + seq + 1].astype(np.int64)
        logits = reference_forward(cfg, state, w[:-1]).logits  # [T, V] fp64
        m = logits.max(-1)
        logz = np.log(np.exp(logits - m[:, None]).sum(-1)) + m
        ce.append(logz - logits[np.arange(seq), w[1:]])
    ce = np.stack(ce)  # [windows, T]
    return [ce[:, s:s + band].mean() for s in range(0, seq, band)], ce.mean()


def _random_stream(n, vocab, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.uint16)


@pytest.mark.parametrize("batch", [1, 3])
def test_band_losses_match_numpy_cross_entropy(batch):
    model = PanguForCausalLM(TINY, 1, 1, "eager")
    state = random_teacher_state(TINY, 3, 0.3)
    load_state(model, state)
    stream = _random_stream(4 * SEQ + 5, TINY.vocab_size)
    res = band_losses(CausalLMTokenLoss(model, SEQ), stream, SEQ, windows=3, band=BAND, batch=batch)
    bands, mean = _numpy_bands(TINY, state, stream, SEQ, BAND, 3)
    assert res["windows"] == 3 and res["tokens_per_band"] == 3 * BAND
    assert [(b["start"], b["end"]) for b in res["bands"]] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    np.testing.assert_allclose([b["loss"] for b in res["bands"]], bands, rtol=1e-4)
    np.testing.assert_allclose(res["mean"], mean, rtol=1e-4)
    assert len(set(np.round(bands, 3))) == 4  # the bands really differ, so a mixed-up band would show


def test_eval_script_on_tiny_config(tmp_path):
    """scripts/eval_teacher_bands.py on configs/tiny.yaml's model: HF checkpoint + .npy stream -> JSON."""
    cfg = load_config(os.path.join(REPO, "configs", "tiny.yaml")).model
    state = random_teacher_state(cfg, 7, 0.1)
    save_teacher_checkpoint(state, cfg, str(tmp_path / "ckpt"))
    stream = _random_stream(2 * SEQ + 1, cfg.vocab_size, seed=1)
    np.save(tmp_path / "held.npy", stream)
    out = tmp_path / "bands.json"
    _load_script().main(["--checkpoint", str(tmp_path / "ckpt"), "--config", os.path.join(REPO, "configs", "tiny.yaml"),
                 "--seq-len", str(SEQ), "--band", str(BAND), "--windows", "5", "--tokens", str(tmp_path / "held.npy"),
                 "--out", str(out)])
    res = json.loads(out.read_text())
    bands, mean = _numpy_bands(cfg, state, stream, SEQ, BAND, 2)
    assert res["windows"] == 2 and res["format"] == "hf"  # 5 asked, the stream holds 2
    np.testing.assert_allclose([b["loss"] for b in res["bands"]], bands, rtol=1e-4)
    np.testing.assert_allclose(res["mean"], mean, rtol=1e-4)


def test_eval_script_on_a_training_work_dir(tmp_path):
    """--checkpoint WORK_DIR reads the newest step-N (a running job can be evaluated without exporting)."""
    cfg_path = os.path.join(REPO, "configs", "tiny.yaml")
    cfg = load_config(cfg_path).model
    stream = _random_stream(3000, cfg.vocab_size, seed=2)
    tcfg = LMTrainConfig(work_dir=str(tmp_path / "run"), seq_len=SEQ, batch_size=1, steps=2, eval_every=0,
                         save_every=100, optim=OptimConfig(lr=1e-2, warmup_steps=1, total_steps=2))
    trained = train_lm(cfg, tcfg, stream, stream, log=lambda s: None)
    np.save(tmp_path / "held.npy", stream)
    out = tmp_path / "bands.json"
    _load_script().main(["--checkpoint", str(tmp_path / "run"), "--config", cfg_path, "--seq-len", str(SEQ),
                         "--band", str(BAND), "--windows", "3", "--tokens", str(tmp_path / "held.npy"),
                         "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["format"] == "training checkpoint" and res["train_step"] == 2
    _, mean = _numpy_bands(cfg, model_state(trained), stream, SEQ, BAND, 3)
    np.testing.assert_allclose(res["mean"], mean, rtol=1e-4)


def _load_script():
    spec = importlib.util.spec_from_file_location("eval_teacher_bands",
                                                  os.path.join(REPO, "scripts", "eval_teacher_bands.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def _config(tmp_path, init_from, steps, stop_after=None, eval_band=0, eval_every=2):
    optim = OptimConfig(lr=5e-3, warmup_steps=1, total_steps=steps)
    return LMTrainConfig(work_dir=str(tmp_path / "run"), seq_len=SEQ, batch_size=2, steps=steps, stop_after=stop_after,
                         eval_every=eval_every, eval_windows=4, save_every=100, log_every=100, init_from=init_from,
                         eval_band=eval_band, optim=optim)


def test_init_from_checkpoint_then_resume_takes_precedence(tmp_path):
    train, held = _random_stream(2000, TINY.vocab_size, 0), _random_stream(400, TINY.vocab_size, 1)
    src_a, src_b = str(tmp_path / "a"), str(tmp_path / "b")
    state_a = random_teacher_state(TINY, 5, 0.3)
    save_teacher_checkpoint(state_a, TINY, src_a, dtype="float16")  # as the shipped teacher: fp16
    save_teacher_checkpoint(random_teacher_state(TINY, 6, 0.3), TINY, src_b, dtype="float16")

    logs = []
    init = train_lm(TINY, _config(tmp_path, src_a, 4, stop_after=0), train, held, log=logs.append)
    assert f"[init] weights from {src_a} (fresh optimiser state)" in logs
    for key, value in model_state(init).items():  # fp16 on disk -> exactly the fp16 values in fp32
        np.testing.assert_array_equal(value, state_a[key].astype(np.float16).astype(np.float32), err_msg=key)

    logs = []
    first = train_lm(TINY, _config(tmp_path, src_a, 4, stop_after=2, eval_band=BAND), train, held, log=logs.append)
    assert latest_step(str(tmp_path / "run" / "checkpoints")) == 2
    evals = [line for line in logs if line.startswith("eval step 2")]
    assert len(evals) == 1 and evals[0].count(" | ") == 3  # 4 bands
    band_vals = [float(part.split()[-1]) for part in evals[0].split("bands ")[1].split(" | ")]
    held_loss = float(evals[0].split("held-out loss ")[1].split()[0])
    assert abs(np.mean(band_vals) - held_loss) < 2e-4  # equal-width bands average to the overall mean
    trained = model_state(first)
    assert any(not np.array_equal(trained[k], state_a[k].astype(np.float16).astype(np.float32)) for k in trained)

    logs = []  # a checkpoint exists: resume wins over --init-from (even another one)
    resumed = train_lm(TINY, _config(tmp_path, src_b, 4, stop_after=2), train, held, log=logs.append)
    assert "[resume] from step 2" in logs and not any(line.startswith("[init]") for line in logs)
    for key, value in model_state(resumed).items():
        np.testing.assert_array_equal(value, trained[key], err_msg=key)

    logs = []  # eval_every=0: no eval, not even at the last step
    train_lm(TINY, _config(tmp_path, src_b, 4, eval_every=0), train, held, log=logs.append)
    assert latest_step(str(tmp_path / "run" / "checkpoints")) == 4
    assert "[resume] from step 2" in logs and not any(line.startswith("eval") for line in logs)


def test_init_from_a_checkpoint_of_another_architecture_fails(tmp_path):
    other = dataclasses.replace(TINY, intermediate_size=48)
    save_teacher_checkpoint(random_teacher_state(other, 0), other, str(tmp_path / "other"))
    stream = _random_stream(500, TINY.vocab_size)
    with pytest.raises(CheckpointError, match="intermediate_size"):
        train_lm(TINY, _config(tmp_path, str(tmp_path / "other"), 2), stream, stream, log=lambda s: None)
    assert latest_step(str(tmp_path / "run" / "checkpoints")) is None
