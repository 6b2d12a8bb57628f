"""Teacher causal-LM training (scripts/train_demo_teacher.py's engine): loss vs a NumPy fp64 reference,
learning on a learnable stream, exact resume after ``stop_after`` (also with a re-planned schedule), and
one trainer per work directory."""
import numpy as np
import pytest
from mindspore import Tensor

from eagle_ms.locks import OutputInUseError
from eagle_ms.models.pangu import PanguForCausalLM
from eagle_ms.train.checkpoint import latest_step
from eagle_ms.train.optim import OptimConfig
from eagle_ms.models.training import CausalLMLoss
from eagle_ms.train.teacher_lm import LMTrainConfig, sample_batch, train_lm
from eagle_ms.weights import load_state, random_teacher_state
from helpers_locks import held_elsewhere
from helpers_models import TINY
from numpy_reference import reference_forward

SEQ = 16


def _stream(n: int, seed: int = 0) -> np.ndarray:
    """A learnable stream: a noisy repetition of a fixed 7-token motif."""
    rng = np.random.default_rng(seed)
    motif = np.array([5, 9, 17, 33, 41, 50, 60], dtype=np.uint16)
    stream = np.resize(motif, n)
    noise = rng.random(n) < 0.1
    stream[noise] = rng.integers(3, TINY.vocab_size, noise.sum())
    return stream


def _weights(model) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy().copy() for p in model.trainable_params()}


def test_loss_matches_numpy_cross_entropy():
    model = PanguForCausalLM(TINY, 1, 1, "eager")
    state = random_teacher_state(TINY, 3, 0.3)
    load_state(model, state)
    ids, labels = sample_batch(_stream(400), 2, SEQ, seed=1, step=0)
    loss = float(CausalLMLoss(model, SEQ)(Tensor(ids), Tensor(labels)).asnumpy())
    expected = []
    for row_ids, row_labels in zip(ids, labels):
        logits = reference_forward(TINY, state, row_ids).logits  # [T, V] fp64
        logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        expected.append(logz - logits[np.arange(SEQ), row_labels])
    np.testing.assert_allclose(loss, np.mean(expected), rtol=1e-4)


def _config(tmp_path, name, steps, stop_after=None):
    optim = OptimConfig(lr=5e-3, warmup_steps=2, total_steps=steps)
    return LMTrainConfig(work_dir=str(tmp_path / name), seq_len=SEQ, batch_size=2, steps=steps, stop_after=stop_after,
                         eval_every=4, eval_windows=4, save_every=100, log_every=100, optim=optim)


def test_training_learns_and_resume_is_exact(tmp_path):
    train, held = _stream(2000, 0), _stream(400, 1)
    logs = []
    full = train_lm(TINY, _config(tmp_path, "full", 8), train, held, log=logs.append)
    evals = [float(line.split("held-out loss ")[1].split()[0]) for line in logs if line.startswith("eval")]
    assert len(evals) == 2 and evals[1] < evals[0] < np.log(TINY.vocab_size)

    first = train_lm(TINY, _config(tmp_path, "split", 8, stop_after=5), train, held, log=lambda s: None)
    assert latest_step(str(tmp_path / "split" / "checkpoints")) == 5
    assert any(not np.array_equal(a, b) for a, b in zip(_weights(first).values(), _weights(full).values()))
    resumed_logs = []
    resumed = train_lm(TINY, _config(tmp_path, "split", 8), train, held, log=resumed_logs.append)
    assert "[resume] from step 5" in resumed_logs
    for name, value in _weights(full).items():
        np.testing.assert_allclose(_weights(resumed)[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_resume_with_a_shorter_schedule_continues_from_the_checkpoint(tmp_path):
    """The demo teacher's recipe: run with one schedule, stop, resume with a shorter one (lr recomputed)."""
    train, held = _stream(2000, 0), _stream(400, 1)
    train_lm(TINY, _config(tmp_path, "run", 40, stop_after=3), train, held, log=lambda s: None)
    logs = []
    train_lm(TINY, _config(tmp_path, "run", 6), train, held, log=logs.append)
    assert "[resume] from step 3" in logs
    assert latest_step(str(tmp_path / "run" / "checkpoints")) == 6


def test_a_work_dir_another_trainer_writes_is_refused(tmp_path):
    cfg = _config(tmp_path, "busy", 4)
    with held_elsewhere("dir", cfg.work_dir) as pid:
        with pytest.raises(OutputInUseError, match=rf"{cfg.work_dir} is being written by another process \(pid {pid}"):
            train_lm(TINY, cfg, _stream(400), _stream(200, 1), log=lambda s: None)
    assert latest_step(str(tmp_path / "busy" / "checkpoints")) is None  # not one step trained
