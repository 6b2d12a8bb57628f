"""HF / openPangu ``config.json`` <-> ``ModelConfig``, and the HF field spellings read in one place.

A teacher checkpoint directory carries an HF-style ``config.json``. Its projection-bias flag is spelled
``bias`` (openPangu) or ``attention_bias`` (Llama); ``hf_bias`` is the one reader of both, used for the
teacher (this module, eagle_ms/weights.py) and the draft (eagle_ms/draft_weights.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import fields
from typing import Any, Mapping

from eagle_ms.config import ModelConfig, build_section


def hf_bias(raw: Mapping[str, Any]) -> bool | None:
    """The q/k/v/o projection-bias flag of an HF config dict: ``bias``, else ``attention_bias``, else None."""
    if "bias" in raw:
        return raw["bias"]
    if "attention_bias" in raw:
        return bool(raw["attention_bias"])
    return None


def model_config_from_hf(path: str, **extra) -> ModelConfig:
    """Read an HF/openPangu ``config.json`` (a file or a directory holding one) into a ModelConfig.

    Only architecture fields are taken; ``compute_dtype`` etc. come from ``extra``.
    """
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except FileNotFoundError:
        raise FileNotFoundError(f"model config.json not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    known = {f.name for f in fields(ModelConfig)}
    data = {k: v for k, v in raw.items() if k in known}
    bias = hf_bias(raw)
    if bias is not None:
        data["bias"] = bias
    eos = data.get("eos_token_id")
    if isinstance(eos, list):
        data["eos_token_id"] = eos[0]
    ids = raw.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None:
        data["aux_layer_ids"] = tuple(ids)
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
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        "torch_dtype": cfg.compute_dtype,
    }
