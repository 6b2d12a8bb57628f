"""Training checkpoints (eagle_ms.train.checkpoint) on a real optimizer (AdamW over a tiny teacher): a
truncated or corrupt newest ``step-N`` makes resume fall back to the intact older step and say so; with
no intact step left, a clear error names the directory and the model stays unchanged."""
import os

import numpy as np
import pytest
from mindspore import Tensor

from eagle_ms.models.pangu import PanguForCausalLM
from eagle_ms.safetensors_format import CheckpointError
from eagle_ms.train.checkpoint import load_model_weights, load_train_state, save_train_state
from eagle_ms.train.optim import OptimConfig, make_optimizer, trainable
from helpers_models import TINY

VALUES = {1: 0.25, 2: 0.5}  # every weight of the model saved at that step


def fresh():
    model = PanguForCausalLM(TINY, 1, 1, "eager")
    return model, make_optimizer(trainable(model), OptimConfig(warmup_steps=1, total_steps=10))


def weight_values(model) -> set[float]:
    return {float(v) for p in trainable(model) for v in np.unique(p.asnumpy())}


def saved_steps(ckpt_dir) -> None:
    model, optimizer = fresh()
    for step, value in VALUES.items():
        for p in trainable(model):
            p.set_data(Tensor(np.full(p.shape, value, np.float32)))
        save_train_state(ckpt_dir, optimizer, step, {"train": [[step, value]]})


def _cut_half(path):
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) // 2)


def _flip_middle_byte(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))


CORRUPTIONS = {  # what happens to step-N/<file>
    "optimizer.ckpt cut to half": ("optimizer.ckpt", _cut_half),
    "optimizer.ckpt one byte flipped": ("optimizer.ckpt", _flip_middle_byte),
    "optimizer.ckpt emptied": ("optimizer.ckpt", lambda p: open(p, "wb").close()),
    "state.json not JSON": ("state.json", lambda p: open(p, "w").write("{")),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_newest_step_falls_back_to_the_older_one_and_says_so(tmp_path, case):
    name, corrupt = CORRUPTIONS[case]
    ckpt_dir = str(tmp_path / "checkpoints")
    saved_steps(ckpt_dir)
    corrupt(os.path.join(ckpt_dir, "step-2", name))
    model, optimizer = fresh()
    logs = []
    step, history = load_train_state(ckpt_dir, optimizer, log=logs.append)
    assert (step, history, weight_values(model)) == (1, {"train": [[1, 0.25]]}, {0.25})
    assert len(logs) == 1 and os.path.join(ckpt_dir, "step-2") in logs[0] and "falling back" in logs[0], logs
    exported = PanguForCausalLM(TINY, 1, 1, "eager")  # the export path reads the same way
    assert load_model_weights(ckpt_dir, exported, log=logs.append) == 1 and weight_values(exported) == {0.25}


def test_no_intact_step_is_a_clear_error_naming_the_directory(tmp_path):
    ckpt_dir = str(tmp_path / "checkpoints")
    saved_steps(ckpt_dir)
    for step in VALUES:
        _cut_half(os.path.join(ckpt_dir, f"step-{step}", "optimizer.ckpt"))
    model, optimizer = fresh()
    before = weight_values(model)
    with pytest.raises(CheckpointError) as err:
        load_train_state(ckpt_dir, optimizer, log=lambda _: None)
    msg = str(err.value)
    assert f"no intact checkpoint under {ckpt_dir}" in msg, msg
    assert all(os.path.join(ckpt_dir, f"step-{s}") in msg for s in VALUES), msg
    assert weight_values(model) == before
