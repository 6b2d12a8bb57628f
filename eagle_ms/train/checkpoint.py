"""Atomic, resumable training checkpoints.

Layout: ``<dir>/step-<N>/`` holding ``optimizer.ckpt`` (MindSpore checkpoint of the optimizer Cell: the
trained weights, AdamW moments and step counter; saved with a CRC) and ``state.json`` (step, loss
history, extra). A step directory is written under a temporary name and renamed when complete, so a
killed process never leaves a directory that looks complete. The two newest step directories are kept.

Loading takes the newest step directory that reads: one whose ``optimizer.ckpt`` cannot be parsed or
fails its CRC (truncated, emptied, bit-flipped; files saved without a CRC are read as they are) or whose
``state.json`` is not valid is logged as ``[checkpoint] <dir> is unreadable ...; falling back`` and the
next older one is tried. With none left the load raises CheckpointError naming the checkpoint directory
and every step's problem. Nothing is loaded into the optimizer or model before a step has read whole.
"""
from __future__ import annotations

import json
import os
import re
import shutil

import mindspore as ms

from eagle_ms.files import replace_dir
from eagle_ms.safetensors_format import CheckpointError

_STEP_DIR = re.compile(r"^step-(\d+)$")
OPTIMIZER_FILE, STATE_FILE = "optimizer.ckpt", "state.json"


def _complete_steps(ckpt_dir: str) -> list[int]:
    if not os.path.isdir(ckpt_dir):
        return []
    steps = []
    for name in os.listdir(ckpt_dir):
        m = _STEP_DIR.match(name)
        if m and os.path.exists(os.path.join(ckpt_dir, name, STATE_FILE)):
            steps.append(int(m.group(1)))
    return sorted(steps)


def latest_step(ckpt_dir: str) -> int | None:
    """The newest complete step directory's N (complete: renamed into place; it may still be corrupt)."""
    steps = _complete_steps(ckpt_dir)
    return steps[-1] if steps else None


def save_train_state(ckpt_dir: str, optimizer, step: int, history: dict, extra: dict | None = None,
                     keep: int = 2) -> str:
    """Write ``step-<step>`` atomically; prune older ones beyond ``keep``. Returns its path."""
    os.makedirs(ckpt_dir, exist_ok=True)

    def build(tmp: str) -> None:
        ms.save_checkpoint(optimizer, os.path.join(tmp, OPTIMIZER_FILE), crc_check=True)
        with open(os.path.join(tmp, STATE_FILE), "w", encoding="utf-8") as fh:
            json.dump({"step": step, "history": history, **(extra or {})}, fh)

    final = replace_dir(os.path.join(ckpt_dir, f"step-{step}"), build)
    for old in _complete_steps(ckpt_dir)[:-keep]:
        shutil.rmtree(os.path.join(ckpt_dir, f"step-{old}"), ignore_errors=True)
    return final


def _read_step(path: str) -> tuple[dict, dict]:
    """(optimizer checkpoint parameters, state.json) of one step directory; CheckpointError if unreadable."""
    try:
        params = ms.load_checkpoint(os.path.join(path, OPTIMIZER_FILE), crc_check=True)
        with open(os.path.join(path, STATE_FILE), encoding="utf-8") as fh:
            state = json.load(fh)
        if not (isinstance(state, dict) and isinstance(state.get("step"), int)
                and isinstance(state.get("history"), dict)):
            raise ValueError(f"{STATE_FILE} lacks an integer 'step' or a 'history' object")
    except (OSError, ValueError, RuntimeError) as exc:  # MindSpore raises ValueError on a bad file
        raise CheckpointError(f"{path}: {exc}") from None
    return params, state


def _newest_intact(ckpt_dir: str, log) -> tuple[int, dict, dict]:
    """(step, parameters, state) of the newest step directory that reads (see the module doc)."""
    steps = _complete_steps(ckpt_dir)
    if not steps:
        raise FileNotFoundError(f"no complete checkpoint (step-N/{STATE_FILE}) under {ckpt_dir}")
    problems = []
    for step in reversed(steps):
        path = os.path.join(ckpt_dir, f"step-{step}")
        try:
            params, state = _read_step(path)
        except CheckpointError as exc:
            problems.append(str(exc))
            log(f"[checkpoint] {path} is unreadable ({exc}); falling back to the previous step")
            continue
        return step, params, state
    raise CheckpointError(f"no intact checkpoint under {ckpt_dir}: {'; '.join(problems)}")


def load_train_state(ckpt_dir: str, optimizer, log=print) -> tuple[int, dict]:
    """Load the newest intact checkpoint into ``optimizer`` (and so its parameters): (step, history).

    A corrupt newer step is skipped with a ``log`` line (module doc)."""
    step, params, state = _newest_intact(ckpt_dir, log)
    path = os.path.join(ckpt_dir, f"step-{step}")
    params.pop("learning_rate", None)  # the schedule comes from the (possibly extended) config
    not_loaded, _ = ms.load_param_into_net(optimizer, params, strict_load=True)
    not_loaded = [name for name in not_loaded if name != "learning_rate"]
    if not_loaded:
        raise ValueError(f"checkpoint {path} lacks optimizer parameters: {not_loaded[:5]}")
    return state["step"], state["history"]


def load_model_weights(ckpt_dir: str, model, log=print) -> int:
    """Load only the model's weights from the newest intact checkpoint (no optimizer needed); returns its
    step. Used to export a snapshot of a run that is still training.
    """
    step, params, _ = _newest_intact(ckpt_dir, log)
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
