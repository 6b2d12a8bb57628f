"""HF / openPangu ``config.json`` <-> ``ModelConfig``, and the HF field spellings read in one place.

A teacher checkpoint directory carries an HF-style ``config.json``, an EAGLE-3 draft directory its own.
The readers here are the only ones of each spelling, used for the teacher (this module,
eagle_ms/weights.py) and the draft (eagle_ms/draft_weights.py):
  * ``read_json_object``: a config.json file, which must hold a JSON object;
  * ``hf_bias``: the projection-bias flag, ``bias`` (openPangu) or ``attention_bias`` (Llama);
  * ``hf_eos_ids``: ``eos_token_id``, an int or (HF) a list of stop ids;
  * ``hf_aux_layer_ids``: ``eagle_aux_hidden_state_layer_ids``, under ``eagle_config`` (drafts) or at the
    top level (this project's teacher config.json).
"""
from __future__ import annotations

import json
import os
from dataclasses import fields
from typing import Any, Mapping

from eagle_ms.config import ModelConfig, build_section
from eagle_ms.safetensors_format import CheckpointError

AUX_IDS_KEY = "eagle_aux_hidden_state_layer_ids"


def read_json_object(path: str) -> dict:
    """The JSON object in the file ``path``. FileNotFoundError propagates (callers decide what a missing
    file means); an unreadable file, invalid JSON or another JSON value (list, number, ...) raise
    CheckpointError naming the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: not a JSON object (it holds a {type(raw).__name__}); a config.json maps "
                              f"field names to values")
    return raw


def hf_bias(raw: Mapping[str, Any]) -> bool | None:
    """The q/k/v/o projection-bias flag of an HF config dict: ``bias``, else ``attention_bias``, else None."""
    if "bias" in raw:
        return raw["bias"]
    if "attention_bias" in raw:
        return bool(raw["attention_bias"])
    return None


def hf_eos_ids(raw: Mapping[str, Any]) -> tuple | None:
    """``eos_token_id`` as a tuple of ids (HF allows an int or a list), or None when absent."""
    eos = raw.get("eos_token_id")
    if eos is None:
        return None
    return tuple(eos) if isinstance(eos, list) else (eos,)


def hf_aux_layer_ids(raw: Mapping[str, Any]):
    """The EAGLE-3 aux layer ids: ``eagle_config.eagle_aux_hidden_state_layer_ids``, else the top-level
    ``eagle_aux_hidden_state_layer_ids``, else None. A list becomes a tuple; any other value is returned
    as it is, for the caller's validation to name."""
    eagle = raw.get("eagle_config")
    ids = eagle[AUX_IDS_KEY] if isinstance(eagle, dict) and AUX_IDS_KEY in eagle else raw.get(AUX_IDS_KEY)
    return tuple(ids) if isinstance(ids, list) else ids


def model_config_from_hf(path: str, **extra) -> ModelConfig:
    """Read an HF/openPangu ``config.json`` (a file or a directory holding one) into a ModelConfig.

    Only architecture fields are taken; ``compute_dtype`` etc. come from ``extra``.
    """
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        raw = read_json_object(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"model config.json not found: {path}") from None
    known = {f.name for f in fields(ModelConfig)}
    data = {k: v for k, v in raw.items() if k in known}
    bias = hf_bias(raw)
    if bias is not None:
        data["bias"] = bias
    eos = hf_eos_ids(raw)
    if eos:
        data["eos_token_id"] = eos[0]
    ids = hf_aux_layer_ids(raw)
    if ids is not None:
        data["aux_layer_ids"] = ids
    data.update(extra)
    return build_section(ModelConfig, data, f"{path}")


def model_config_to_hf(cfg: ModelConfig) -> dict:
    """The HF/openPangu ``config.json`` dict for this architecture."""
    return {
        "architectures": ["PanguEmbeddedForCausalLM"],
        "model_type": "PanguEmbedded",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "hidden_act": "silu",
        "bias": cfg.bias,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        AUX_IDS_KEY: list(cfg.aux_layer_ids),
        "torch_dtype": cfg.compute_dtype,
    }
