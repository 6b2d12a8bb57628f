"""Content hashes and fingerprints shared by regeneration, preprocessing and the draft vocabulary.

Every cache key in ``eagle_ms.train`` is ``json_hash`` of a plain dict, so a key is reproducible from
the values it names (sorted keys, no whitespace, UTF-8). The ingredients:

* ``file_sha256(path, memo_path)`` (eagle_ms/files.py): sha256 of a file's bytes, memoised per (path,
  size, mtime_ns) in a JSON file (hashing a 15 GB checkpoint once, not per run);
* ``teacher_fingerprint(cfg)``: what determines the teacher's numbers: the architecture (every
  ``model.model_config`` field incl. compute dtype and aux layers), the weights (sha256 of every
  checkpoint file, or ``random:<seed>`` for seeded random weights) and the attention backend;
* ``tokenizer_fingerprint(cfg)``: sha256 of the SentencePiece model file (``None`` without one) and the
  chat template as a dict (a built-in name is expanded, so editing a built-in changes the key).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np

from eagle_ms.files import file_sha256

CHECKPOINT_SUFFIXES = (".safetensors", ".json")


def json_hash(obj) -> str:
    """sha256 hex of the canonical JSON of ``obj`` (sorted keys, compact separators)."""
    raw = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_jsonable)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def _jsonable(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, (tuple, set)):
        return list(value)
    raise TypeError(f"cannot hash {type(value).__name__} {value!r}")


def array_hash(*arrays: np.ndarray) -> str:
    """sha256 hex over (dtype, shape, bytes) of each array, in order."""
    h = hashlib.sha256()
    for arr in arrays:
        arr = np.ascontiguousarray(arr)
        h.update(f"{arr.dtype.str}{arr.shape}".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def checkpoint_files(checkpoint: str) -> list[str]:
    """The files that define a checkpoint: a file itself, or a directory's *.safetensors and *.json."""
    if os.path.isfile(checkpoint):
        return [checkpoint]
    if not os.path.isdir(checkpoint):
        raise FileNotFoundError(f"teacher checkpoint not found: {checkpoint}")
    names = sorted(n for n in os.listdir(checkpoint) if n.endswith(CHECKPOINT_SUFFIXES))
    if not names:
        raise FileNotFoundError(f"teacher checkpoint directory {checkpoint} holds no .safetensors/.json file")
    return [os.path.join(checkpoint, n) for n in names]


def teacher_fingerprint(cfg, backend: str, memo_path: str | None = None) -> dict:
    """What determines the teacher's outputs (see module doc). ``cfg``: EagleMsConfig."""
    if cfg.checkpoint is None:
        weights = {"random_seed": cfg.runtime.seed}
    else:
        weights = {os.path.basename(f): file_sha256(f, memo_path) for f in checkpoint_files(cfg.checkpoint)}
    return {"model": dataclasses.asdict(cfg.model), "weights": weights, "backend": backend,
            "device": cfg.runtime.device_target}


def template_dict(cfg) -> dict:
    """The configured chat template as a plain dict (built-in names expanded)."""
    from eagle_ms.tokenizer import ChatTemplate, get_template

    tmpl = cfg.tokenizer.chat_template
    return (get_template(tmpl) if isinstance(tmpl, str) else ChatTemplate.from_dict(tmpl)).to_dict()


def tokenizer_fingerprint(cfg, memo_path: str | None = None) -> dict:
    """{"tokenizer_sha256": ... or None, "chat_template": dict}."""
    model_file = cfg.tokenizer.model_file
    return {"tokenizer_sha256": file_sha256(model_file, memo_path) if model_file else None,
            "chat_template": template_dict(cfg)}
