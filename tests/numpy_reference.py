"""Independent NumPy float64 forward of the Pangu teacher (the second implementation of rule 8).

Written from the architecture description only (openPangu-Embedded = Llama-like), sharing nothing with
``eagle_ms`` except the ``ModelConfig`` field names and the HF parameter-name layout of ``state``:

    x_0 = embed[tokens]
    for layer i:   aux records x_i when i in cfg.aux_layer_ids  (hidden state ENTERING layer i)
        h = rmsnorm(x_i) ; q,k,v = h W^T + b ; RoPE (rotate-half) on q,k ; causal GQA softmax attention
        x = x_i + o_proj(attn) ; x_{i+1} = x + down(silu(gate(rmsnorm(x))) * up(rmsnorm(x)))
    logits = rmsnorm_final(x_L) @ (lm_head or embed)^T

GQA: query head h reads kv head h // (Hq / Hkv) (HF ``repeat_kv``). Everything is float64, one full
sequence at a time, no cache: a full-sequence forward is the ground truth for incremental decoding.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ReferenceOutput:
    """logits [T, V] float64; aux [T, 3H] float64 (hidden states entering the aux layers, in order)."""

    logits: np.ndarray
    aux: np.ndarray


def random_state(cfg, seed: int, std: float = 0.2) -> dict[str, np.ndarray]:
    """Seeded random weights under HF keys (float32 arrays, as a checkpoint would hold them).

    Norm weights are 1 + noise (not ones) so a wrong norm weight would show; biases are random
    (not zero) so a missing or misplaced bias would show.
    """
    rng = np.random.default_rng(seed)
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads

    def normal(*shape):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    state = {"model.embed_tokens.weight": normal(cfg.vocab_size, h),
             "model.norm.weight": (1.0 + normal(h)).astype(np.float32)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = (1.0 + normal(h)).astype(np.float32)
        state[p + "post_attention_layernorm.weight"] = (1.0 + normal(h)).astype(np.float32)
        for name, out_dim, in_dim in (("q_proj", hq * d, h), ("k_proj", hkv * d, h),
                                      ("v_proj", hkv * d, h), ("o_proj", h, hq * d)):
            state[p + f"self_attn.{name}.weight"] = normal(out_dim, in_dim)
            if cfg.bias:
                state[p + f"self_attn.{name}.bias"] = normal(out_dim)
        state[p + "mlp.gate_proj.weight"] = normal(inter, h)
        state[p + "mlp.up_proj.weight"] = normal(inter, h)
        state[p + "mlp.down_proj.weight"] = normal(h, inter)
    if not cfg.tie_word_embeddings:
        state["lm_head.weight"] = normal(cfg.vocab_size, h)
    return state


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _linear(x: np.ndarray, state: dict, key: str) -> np.ndarray:
    """x [T, in] @ W[out, in]^T (+ bias if the state has one)."""
    y = x @ state[key + ".weight"].astype(np.float64).T
    bias = state.get(key + ".bias")
    return y if bias is None else y + bias.astype(np.float64)


def _rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """x [heads, T, D], positions [T] -> rotate-half RoPE: x*cos + [-x2, x1]*sin."""
    d = x.shape[-1]
    inv_freq = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [D/2]
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # [T, D/2]
    cos = np.cos(np.concatenate([angles, angles], axis=-1))  # [T, D]
    sin = np.sin(np.concatenate([angles, angles], axis=-1))
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + np.concatenate([-x2, x1], axis=-1) * sin


def _attention(cfg, state: dict, prefix: str, h: np.ndarray, positions: np.ndarray,
               allowed: np.ndarray) -> np.ndarray:
    """GQA self-attention over the full sequence. h [T, H], allowed [T, T] bool -> [T, H]."""
    t = h.shape[0]
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = _linear(h, state, prefix + "q_proj").reshape(t, hq, d).transpose(1, 0, 2)  # [Hq, T, D]
    k = _linear(h, state, prefix + "k_proj").reshape(t, hkv, d).transpose(1, 0, 2)  # [Hkv, T, D]
    v = _linear(h, state, prefix + "v_proj").reshape(t, hkv, d).transpose(1, 0, 2)
    q, k = _rope(q, positions, cfg.rope_theta), _rope(k, positions, cfg.rope_theta)
    group = hq // hkv
    kv_of_head = np.arange(hq) // group  # repeat_kv: head h reads kv head h // group
    k, v = k[kv_of_head], v[kv_of_head]  # [Hq, T, D]
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(d)  # [Hq, T, T]
    scores = np.where(allowed[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = (probs @ v).transpose(1, 0, 2).reshape(t, hq * d)  # [T, Hq*D]
    return _linear(out, state, prefix + "o_proj")


def _mlp(state: dict, prefix: str, h: np.ndarray) -> np.ndarray:
    gate = _linear(h, state, prefix + "gate_proj")
    silu = gate / (1.0 + np.exp(-gate))
    return _linear(silu * _linear(h, state, prefix + "up_proj"), state, prefix + "down_proj")


def reference_forward(cfg, state: dict[str, np.ndarray], tokens, positions=None, allowed=None) -> ReferenceOutput:
    """Full-sequence forward of ``tokens`` [T] in float64.

    ``positions`` [T] (RoPE) default 0..T-1; ``allowed`` [T, T] bool (row i may attend to token j)
    defaults to causal (j <= i). Every row must allow itself.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    t = tokens.size
    positions = np.arange(t) if positions is None else np.asarray(positions)
    allowed = np.tril(np.ones((t, t), dtype=bool)) if allowed is None else np.asarray(allowed, dtype=bool)
    assert positions.shape == (t,) and allowed.shape == (t, t) and allowed[np.arange(t), np.arange(t)].all()
    w = {k: v.astype(np.float64) for k, v in state.items()}
    eps = cfg.rms_norm_eps
    x = w["model.embed_tokens.weight"][tokens]  # [T, H]
    aux = []
    for i in range(cfg.num_hidden_layers):
        if i in cfg.aux_layer_ids:
            aux.append(x)
        p = f"model.layers.{i}."
        x = x + _attention(cfg, w, p + "self_attn.", _rmsnorm(x, w[p + "input_layernorm.weight"], eps),
                           positions, allowed)
        x = x + _mlp(w, p + "mlp.", _rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps))
    x = _rmsnorm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    aux_ids = list(cfg.aux_layer_ids)
    assert len(aux) == 3 and aux_ids == sorted(aux_ids), aux_ids
    return ReferenceOutput(logits=x @ head.T, aux=np.concatenate(aux, axis=-1))
