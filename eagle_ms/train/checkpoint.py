"""Atomic, resumable training checkpoints.

Layout: ``<dir>/step-<N>/`` holding ``optimizer.ckpt`` (MindSpore checkpoint of the optimizer Cell: the
trained weights, AdamW moments and step counter) and ``state.json`` (step, loss history, extra). A step
directory is written under a temporary name and renamed when complete, so a killed process never
leaves a directory that looks complete. The two newest step directories are kept.
"""
from __future__ import annotations

import json
import os
import re
import shutil

import mindspore as ms

from eagle_ms.files import replace_dir

_STEP_DIR = re.compile(r"^step-(\d+)$")


def _complete_steps(ckpt_dir: str) -> list[int]:
    if not os.path.isdir(ckpt_dir):
        return []
    steps = []
    for name in os.listdir(ckpt_dir):
        m = _STEP_DIR.match(name)
        if m and os.path.exists(os.path.join(ckpt_dir, name, "state.json")):
            steps.append(int(m.group(1)))
    return sorted(steps)


def latest_step(ckpt_dir: str) -> int | None:
    steps = _complete_steps(ckpt_dir)
    return steps[-1] if steps else None


def save_train_state(ckpt_dir: str, optimizer, step: int, history: dict, extra: dict | None = None,
                     keep: int = 2) -> str:
    """Write ``step-<step>`` atomically; prune older ones beyond ``keep``. Returns its path."""
    os.makedirs(ckpt_dir, exist_ok=True)

    def build(tmp: str) -> None:
        ms.save_checkpoint(optimizer, os.path.join(tmp, "optimizer.ckpt"))
        with open(os.path.join(tmp, "state.json"), "w", encoding="utf-8") as fh:
            json.dump({"step": step, "history": history, **(extra or {})}, fh)

    final = replace_dir(os.path.join(ckpt_dir, f"step-{step}"), build)
    for old in _complete_steps(ckpt_dir)[:-keep]:
        shutil.rmtree(os.path.join(ckpt_dir, f"step-{old}"), ignore_errors=True)
    return final


def load_train_state(ckpt_dir: str, optimizer) -> tuple[int, dict]:
    """Load the newest complete checkpoint into ``optimizer`` (and so its parameters): (step, history)."""
    step = latest_step(ckpt_dir)
    if step is None:
        raise FileNotFoundError(f"no complete checkpoint (step-N/state.json) under {ckpt_dir}")
    path = os.path.join(ckpt_dir, f"step-{step}")
    params = ms.load_checkpoint(os.path.join(path, "optimizer.ckpt"))
    params.pop("learning_rate", None)  # the schedule comes from the (possibly extended) config
    not_loaded, _ = ms.load_param_into_net(optimizer, params, strict_load=True)
    not_loaded = [name for name in not_loaded if name != "learning_rate"]
    if not_loaded:
        raise ValueError(f"checkpoint {path} lacks optimizer parameters: {not_loaded[:5]}")
    with open(os.path.join(path, "state.json"), encoding="utf-8") as fh:
        state = json.load(fh)
    return int(state["step"]), state["history"]


def load_model_weights(ckpt_dir: str, model) -> int:
    """Load only the model's weights from the newest checkpoint (no optimizer needed); returns its step.

    Used to export a snapshot of a run that is still training.
    """
    step = latest_step(ckpt_dir)
    if step is None:
        raise FileNotFoundError(f"no complete checkpoint (step-N/state.json) under {ckpt_dir}")
    params = ms.load_checkpoint(os.path.join(ckpt_dir, f"step-{step}", "optimizer.ckpt"))
    # Weights are saved under the training wrapper's names (e.g. "full.teacher.<name>"); moments under
    # "adam_m."/"adam_v.". Match each model parameter by name suffix, exactly once.
    weights = {k: v for k, v in params.items() if not k.startswith(("adam_m.", "adam_v."))}
    found, problems = {}, []
    for name, param in model.parameters_and_names():
        if not param.requires_grad:
            continue
        matches = [k for k in weights if k == name or k.endswith("." + name)]
        if len(matches) != 1:
            problems.append(f"{name}: {len(matches)} matches")
        else:
            found[name] = weights[matches[0]]
    if problems:
        raise ValueError(f"checkpoint step-{step} under {ckpt_dir}: cannot map model weights: {problems[:5]}")
    for name, param in model.parameters_and_names():
        if name in found:
            param.set_data(found[name])
    return step
