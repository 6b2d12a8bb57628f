"""The tests' own reading of a Cell's raw parameters in the HF checkpoint layout: a second implementation
of eagle_ms/models/param_layout.py, written from its documented contract (matrices stored [in, out];
``qkv_proj`` = [q | k | v] columns, ``gate_up_proj`` = [gate | up] columns), by name patterns only.

Not a conftest: test modules import it (``tests/`` is on ``sys.path``).
"""
from __future__ import annotations

import numpy as np

import mindspore as ms


def raw_parameters(model) -> dict[str, np.ndarray]:
    """Parameter name -> float32 NumPy value (bf16 widened), without the KV caches."""
    out = {}
    for name, p in model.parameters_and_names():
        if name.endswith(("k_cache", "v_cache")):
            continue
        out[name] = (p.astype(ms.float32) if p.dtype == ms.bfloat16 else p).asnumpy()
    return out


def hf_state_from_cell(model, q_out: int) -> dict[str, np.ndarray]:
    """HF key -> array from the raw parameters; ``q_out`` = query heads x head_dim (the q block's width)."""
    state = {}
    for name, value in raw_parameters(model).items():
        if name.endswith(("qkv_proj.weight", "qkv_proj.bias")):
            prefix, kind = name.rsplit("qkv_proj.", 1)
            kv_out = (value.shape[-1] - q_out) // 2
            bounds = {"q_proj": (0, q_out), "k_proj": (q_out, q_out + kv_out), "v_proj": (q_out + kv_out, None)}
            for part, (lo, hi) in bounds.items():
                block = value[..., lo:hi]
                state[f"{prefix}{part}.{kind}"] = block.T.copy() if kind == "weight" else block.copy()
        elif name.endswith("gate_up_proj.weight"):
            prefix = name[:-len("gate_up_proj.weight")]
            half = value.shape[1] // 2
            state[prefix + "gate_proj.weight"] = value[:, :half].T.copy()
            state[prefix + "up_proj.weight"] = value[:, half:].T.copy()
        elif value.ndim == 2 and not name.endswith("embed_tokens.weight"):
            state[name] = value.T.copy()  # a Linear: [in, out] in the Cell, [out, in] in HF
        else:
            state[name] = value
    return state
