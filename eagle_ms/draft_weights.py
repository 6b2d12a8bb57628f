"""EAGLE-3 draft checkpoints: the interoperable format (docs/eagle3_format.md), strict and explicit.

A draft checkpoint is a directory holding ``model.safetensors`` and ``config.json``:

    fc.weight                                  [H, 3*Ht]
    midlayer.self_attn.q_proj.weight           [Hq*D, 2H]
    midlayer.self_attn.{k,v}_proj.weight       [Hkv*D, 2H]
    midlayer.self_attn.o_proj.weight           [H, Hq*D]
    midlayer.mlp.{gate,up}_proj.weight         [I, H]
    midlayer.mlp.down_proj.weight              [H, I]
    midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight   [H]
    norm.weight                                [H]
    lm_head.weight                             [Vd, H]
    d2t                                        [Vd] int64   target id = draft id + d2t[draft id]
    t2d                                        [V]  bool    target id is in the draft vocabulary

No embedding is stored (the draft reads the teacher's). ``d2t``/``t2d`` may be absent when
``draft_vocab_size == vocab_size`` (identity). Any ``embed_tokens`` key a foreign exporter left in is
ignored. Every float tensor read from a file must be finite and plausible for its F16/BF16 tag
(``safetensors_format.check_float_tensor``). Errors are ``CheckpointError`` naming the key, the shapes
and the file.

State dicts here map checkpoint keys to NumPy arrays (floats as float32, ``d2t`` int64, ``t2d`` bool).
The draft Cell stores the matrices [in, out], q/k/v and gate/up packed (eagle_ms/models/param_layout.py).
"""
from __future__ import annotations

import math
import os
import zlib

import numpy as np

from mindspore import Tensor

from eagle_ms.config import ModelConfig
from eagle_ms.files import write_json_atomic
from eagle_ms.hf_config import hf_aux_layer_ids, hf_bias, read_json_object
from eagle_ms.models.eagle3 import Eagle3Config
from eagle_ms.models.param_layout import checkpoint_slots, params_from_state, state_from_params
from eagle_ms.models.weight_tiles import pack_tiles
from eagle_ms.safetensors_format import CheckpointError, SafetensorsFile, check_float_tensor, write_safetensors
from eagle_ms.weights import SINGLE_FILE

CONFIG_FILE = "config.json"
ARCHITECTURE = "LlamaForCausalLMEagle3"
VOCAB_KEYS = ("d2t", "t2d")
EMBED_MARK = "embed_tokens"  # keys containing this are the teacher's embedding: never draft content
DEFAULT_ROPE_THETA = 10000.0  # what EAGLE assumes when a draft config.json has no rope_theta


def expected_draft_keys(cfg: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """Checkpoint key -> shape for the float weights (d2t/t2d excluded), in checkpoint order."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q_out, kv_out = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    keys = {"fc.weight": (h, 3 * cfg.target_hidden_size)}
    for proj, out, inp in (("q", q_out, 2 * h), ("k", kv_out, 2 * h), ("v", kv_out, 2 * h), ("o", h, q_out)):
        keys[f"midlayer.self_attn.{proj}_proj.weight"] = (out, inp)
    keys["midlayer.mlp.gate_proj.weight"] = (i, h)
    keys["midlayer.mlp.up_proj.weight"] = (i, h)
    keys["midlayer.mlp.down_proj.weight"] = (h, i)
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        keys[f"midlayer.{norm}.weight"] = (h,)
    keys["norm.weight"] = (h,)
    keys["lm_head.weight"] = (cfg.draft_vocab_size, h)
    return keys


# ----------------------------------------------------------------------------------------------
# Draft vocabulary maps
# ----------------------------------------------------------------------------------------------

def vocab_maps(used_tokens, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Target ids kept in the draft vocabulary -> (d2t int64 [Vd], t2d bool [V]) as EAGLE-3 builds them.

    Ids are sorted ascending (draft id i <-> i-th smallest kept target id).
    Example: used [7, 2, 5], V = 8 -> d2t [2, 4, 5] (2-0, 5-1, 7-2); t2d True at 2, 5, 7.
    """
    used = np.asarray(used_tokens, dtype=np.int64).reshape(-1)
    if used.size == 0 or np.any(used < 0) or np.any(used >= vocab_size) or np.unique(used).size != used.size:
        raise ValueError(f"used_tokens must be distinct ids in [0, {vocab_size}), got {used.size} ids")
    used = np.sort(used)
    t2d = np.zeros(vocab_size, bool)
    t2d[used] = True
    return used - np.arange(used.size), t2d


def check_vocab_maps(d2t: np.ndarray, t2d: np.ndarray, cfg: Eagle3Config, source: str = "<state>") -> None:
    """Raise CheckpointError unless d2t [Vd] and t2d [V] describe the same set of Vd distinct target ids."""
    vd, v = cfg.draft_vocab_size, cfg.vocab_size
    if tuple(d2t.shape) != (vd,):
        raise CheckpointError(f"{source}: 'd2t' has shape {tuple(d2t.shape)}, expected ({vd},) = draft_vocab_size")
    if tuple(t2d.shape) != (v,):
        raise CheckpointError(f"{source}: 't2d' has shape {tuple(t2d.shape)}, expected ({v},) = vocab_size")
    if d2t.dtype.kind not in "iu":
        raise CheckpointError(f"{source}: 'd2t' must hold integers (offsets), got dtype {d2t.dtype}")
    if t2d.dtype.kind not in "bui":
        raise CheckpointError(f"{source}: 't2d' must be bool, got dtype {t2d.dtype}")
    targets = np.arange(vd, dtype=np.int64) + d2t.astype(np.int64)
    bad = np.flatnonzero((targets < 0) | (targets >= v))
    if bad.size:
        i = int(bad[0])
        raise CheckpointError(f"{source}: 'd2t' maps {bad.size} draft id(s) outside [0, vocab_size={v}); the first: "
                              f"d2t[{i}] = {int(d2t[i])} maps draft id {i} to target id {int(targets[i])}")
    if np.unique(targets).size != vd:
        raise CheckpointError(f"{source}: 'd2t' maps two draft ids to the same target id")
    in_t2d = t2d.astype(bool)
    if int(in_t2d.sum()) != vd:
        raise CheckpointError(f"{source}: 't2d' marks {int(in_t2d.sum())} target ids, but d2t has "
                              f"draft_vocab_size={vd} entries (d2t inconsistent with t2d)")
    missing = np.flatnonzero(~in_t2d[targets])
    if missing.size:
        raise CheckpointError(f"{source}: d2t inconsistent with t2d: draft id {missing[0]} -> target id "
                              f"{targets[missing[0]]}, which t2d does not mark")


def draft_to_target(d2t: np.ndarray) -> np.ndarray:
    """[Vd] target id of each draft id."""
    return np.arange(d2t.size, dtype=np.int64) + np.asarray(d2t, np.int64)


# ----------------------------------------------------------------------------------------------
# config.json
# ----------------------------------------------------------------------------------------------

def draft_config_to_json(cfg: Eagle3Config, torch_dtype: str = "float32") -> dict:
    """The ``config.json`` dict (SpecForge/SGLang/vLLM readable; every field we rely on explicit)."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": False,
        "torch_dtype": torch_dtype,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
                         "use_aux_hidden_state": True},
    }


def draft_config_from_json(raw: dict, source: str, teacher: ModelConfig | None = None) -> Eagle3Config:
    """Read an EAGLE-3 ``config.json`` dict. Defaults for fields foreign drafts often omit:
    ``draft_vocab_size`` = vocab_size, ``target_hidden_size`` = hidden_size, ``rope_theta`` = 10000,
    ``rms_norm_eps`` = 1e-5, aux layer ids = the teacher's (when ``teacher`` is given).
    """
    def need(name):
        if name not in raw:
            raise CheckpointError(f"{source}: config.json has no '{name}'")
        return raw[name]

    if raw.get("eagle_config") is not None and not isinstance(raw["eagle_config"], dict):
        raise CheckpointError(f"{source}: 'eagle_config' must be a JSON object, got {raw['eagle_config']!r}")
    ids = hf_aux_layer_ids(raw)
    if ids is None:
        if teacher is None:
            raise CheckpointError(f"{source}: config.json has no eagle_config.eagle_aux_hidden_state_layer_ids")
        ids = teacher.aux_layer_ids
    if hf_bias(raw):
        raise CheckpointError(f"{source}: drafts with projection biases are not supported (config 'bias')")
    try:
        return Eagle3Config(
            hidden_size=need("hidden_size"), intermediate_size=need("intermediate_size"),
            num_attention_heads=need("num_attention_heads"),
            num_key_value_heads=raw.get("num_key_value_heads", raw.get("num_attention_heads")),
            vocab_size=need("vocab_size"),
            draft_vocab_size=raw.get("draft_vocab_size") or need("vocab_size"),
            target_hidden_size=raw.get("target_hidden_size") or need("hidden_size"),
            aux_layer_ids=ids,
            head_dim=raw.get("head_dim"),
            rope_theta=raw.get("rope_theta", DEFAULT_ROPE_THETA),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
        )
    except ValueError as exc:
        raise CheckpointError(f"{source}: {exc}") from None


def check_draft_matches_teacher(cfg: Eagle3Config, teacher: ModelConfig, source: str = "<draft>") -> None:
    """The draft must be built for this teacher: vocab size, hidden size and aux layers."""
    diffs = []
    if cfg.vocab_size != teacher.vocab_size:
        diffs.append(f"target vocab_size: draft {cfg.vocab_size} != teacher {teacher.vocab_size}")
    if cfg.target_hidden_size != teacher.hidden_size:
        diffs.append(f"target_hidden_size: draft {cfg.target_hidden_size} != teacher hidden_size "
                     f"{teacher.hidden_size}")
    if cfg.hidden_size != teacher.hidden_size:
        diffs.append(f"hidden_size: draft {cfg.hidden_size} != teacher {teacher.hidden_size} (the draft reads "
                     f"the teacher's token embedding)")
    if tuple(cfg.aux_layer_ids) != tuple(teacher.aux_layer_ids):
        diffs.append(f"aux layer ids: draft {list(cfg.aux_layer_ids)} != teacher {list(teacher.aux_layer_ids)}")
    if diffs:
        raise CheckpointError(f"draft {source} does not fit the teacher: {'; '.join(diffs)}")


# ----------------------------------------------------------------------------------------------
# Random drafts, load, save
# ----------------------------------------------------------------------------------------------

def default_draft_config(teacher: ModelConfig, draft_vocab_size: int | None = None,
                         **overrides) -> Eagle3Config:
    """A draft shaped like one teacher layer (the usual choice), for random/untrained drafts."""
    fields = dict(hidden_size=teacher.hidden_size, intermediate_size=teacher.intermediate_size,
                  num_attention_heads=teacher.num_attention_heads,
                  num_key_value_heads=teacher.num_key_value_heads, head_dim=teacher.head_dim,
                  vocab_size=teacher.vocab_size, draft_vocab_size=draft_vocab_size or teacher.vocab_size,
                  target_hidden_size=teacher.hidden_size, aux_layer_ids=teacher.aux_layer_ids,
                  rope_theta=teacher.rope_theta, rms_norm_eps=teacher.rms_norm_eps)
    fields.update(overrides)
    return Eagle3Config(**fields)


def random_draft_state(cfg: Eagle3Config, seed: int, std: float = 0.02, used_tokens=None) -> dict[str, np.ndarray]:
    """Seeded float32 weights (N(0, std); norms 1 + N(0, std)), each key its own stream
    ``default_rng([seed, crc32(key)])``; plus d2t/t2d: ``used_tokens`` if given, else (when the draft
    vocabulary is reduced) a seeded random subset of the target ids.
    """
    state = {}
    for key, shape in expected_draft_keys(cfg).items():
        rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
        noise = rng.standard_normal(shape) * std
        state[key] = (1.0 + noise if "norm" in key else noise).astype(np.float32)
    if used_tokens is None and cfg.draft_vocab_size < cfg.vocab_size:
        rng = np.random.default_rng([seed, zlib.crc32(b"used_tokens")])
        used_tokens = rng.choice(cfg.vocab_size, cfg.draft_vocab_size, replace=False)
    if used_tokens is not None:
        state["d2t"], state["t2d"] = vocab_maps(used_tokens, cfg.vocab_size)
    return state


def check_draft_state(state: dict, cfg: Eagle3Config, source: str = "<state>") -> dict[str, np.ndarray]:
    """Validate keys/shapes/dtypes and the vocab maps; return the state with d2t/t2d always present."""
    state = {k: np.asarray(v) for k, v in state.items() if EMBED_MARK not in k}
    expected = expected_draft_keys(cfg)
    missing = [f"'{k}' (expected shape {s})" for k, s in expected.items() if k not in state]
    if missing:
        raise CheckpointError(f"draft checkpoint {source}: missing {len(missing)} key(s): {'; '.join(missing[:5])}")
    unexpected = [k for k in state if k not in expected and k not in VOCAB_KEYS]
    if unexpected:
        raise CheckpointError(f"draft checkpoint {source}: unexpected key(s) {unexpected[:5]} "
                              f"(an EAGLE-3 draft has fc, midlayer.*, norm, lm_head, d2t, t2d)")
    bad = [f"'{k}': shape {tuple(state[k].shape)} != expected {s}" for k, s in expected.items()
           if tuple(state[k].shape) != s]
    bad += [f"'{k}': dtype {state[k].dtype} is not a float type" for k in expected if state[k].dtype.kind != "f"]
    if bad:
        raise CheckpointError(f"draft checkpoint {source}: {len(bad)} tensor(s) do not fit the draft config: "
                              f"{'; '.join(bad[:5])}")
    present = [k for k in VOCAB_KEYS if k in state]
    if len(present) == 1:
        raise CheckpointError(f"draft checkpoint {source}: has '{present[0]}' but not "
                              f"'{({'d2t', 't2d'} - set(present)).pop()}' (both or neither)")
    if not present:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise CheckpointError(f"draft checkpoint {source}: no 'd2t'/'t2d' but draft_vocab_size "
                                  f"{cfg.draft_vocab_size} != vocab_size {cfg.vocab_size}")
        state["d2t"] = np.zeros(cfg.draft_vocab_size, np.int64)
        state["t2d"] = np.ones(cfg.vocab_size, bool)
    check_vocab_maps(state["d2t"], state["t2d"], cfg, source)
    return state


def save_draft_checkpoint(state: dict, cfg: Eagle3Config, out_dir: str, dtype: str = "float32") -> list[str]:
    """Write ``model.safetensors`` (+ ``config.json``) atomically; d2t as int64, t2d as bool.

    d2t/t2d are omitted when they are the identity map of a full draft vocabulary (as EAGLE drops them).
    """
    state = check_draft_state(state, cfg, "<state to save>")
    tensors = {k: state[k].astype(np.float32) for k in expected_draft_keys(cfg)}
    identity = cfg.draft_vocab_size == cfg.vocab_size and not np.any(state["d2t"])
    if not identity:
        tensors["d2t"] = state["d2t"].astype(np.int64)
        tensors["t2d"] = state["t2d"].astype(bool)
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, SINGLE_FILE), tensors, {"format": "pt"},
                      float_dtype=dtype)
    write_json_atomic(os.path.join(out_dir, CONFIG_FILE), draft_config_to_json(cfg, dtype), indent=2)
    return [SINGLE_FILE, CONFIG_FILE]


def load_draft_checkpoint(path: str, teacher: ModelConfig | None = None) -> tuple[Eagle3Config, dict]:
    """(config, state) from a draft directory (or its ``model.safetensors`` with config.json beside it).

    With ``teacher``: missing aux ids default to the teacher's and the draft must match it
    (``check_draft_matches_teacher``).
    """
    st_path = os.path.join(path, SINGLE_FILE) if os.path.isdir(path) else path
    cfg_path = os.path.join(os.path.dirname(st_path), CONFIG_FILE)
    if not os.path.isfile(st_path):
        raise CheckpointError(f"draft checkpoint not found: {st_path} (expected a directory with "
                              f"{SINGLE_FILE} and {CONFIG_FILE})")
    try:
        raw = read_json_object(cfg_path)
    except FileNotFoundError:
        raise CheckpointError(f"draft checkpoint {path}: no {CONFIG_FILE} at {cfg_path}") from None
    cfg = draft_config_from_json(raw, cfg_path, teacher)
    if teacher is not None:
        check_draft_matches_teacher(cfg, teacher, path)
    f = SafetensorsFile(st_path)
    header = {k: f.tensors[k][1] for k in f.keys() if EMBED_MARK not in k}
    expected = expected_draft_keys(cfg)
    wrong = [f"'{k}': shape {header[k]} in {st_path} != expected {s}" for k, s in expected.items()
             if k in header and header[k] != s]
    if wrong:  # before reading any data
        raise CheckpointError(f"draft checkpoint {path}: {'; '.join(wrong[:5])}")
    state = {}
    for key in header:
        state[key] = f.read(key)
        check_float_tensor(key, state[key], f.tensors[key][0], st_path)
    return cfg, check_draft_state(state, cfg, st_path)


def with_score_temperature(state: dict, temperature: float) -> dict:
    """``state`` with the final norm's weight ``norm.weight`` divided by ``temperature`` T (float64, then
    float32): the final norm feeds only the lm_head, so the draft's log-probs become log_softmax(logits / T),
    the scores that rank the draft tree (``speculative.score_temperature``). Each row's top-k is unchanged;
    T < 1 makes likely tokens' log-probs nearer 0 and unlikely ones' more negative, so the budget goes to
    deeper chains. The norm, not the lm_head, takes T so that the matrices stay as stored (float16 for the
    shipped draft, read as float16 by the kernels: ``kernel_weight_dtype``). Input unchanged; T = 1 returns it."""
    if temperature == 1.0:
        return state
    out = dict(state)
    out["norm.weight"] = (np.asarray(state["norm.weight"], np.float64) / temperature).astype(np.float32)
    return out


def matrix_keys(cfg: Eagle3Config) -> list[str]:
    """The checkpoint keys of the weight matrices (every 2-D float weight: fc, q/k/v/o, gate/up/down,
    lm_head), the ones the layer kernels may read as float16."""
    return [key for key, shape in expected_draft_keys(cfg).items() if len(shape) == 2]


def not_float16(state: dict, cfg: Eagle3Config) -> list[str]:
    """The weight-matrix keys of ``state`` holding a value that float16 does not represent exactly (empty:
    the layer kernels can read every matrix as float16 with the same results)."""
    values = {key: np.asarray(state[key], np.float32) for key in matrix_keys(cfg)}
    with np.errstate(over="ignore"):
        return [k for k, v in values.items() if not np.array_equal(v.astype(np.float16).astype(np.float32), v, True)]


def load_draft_state(draft, state: dict, embed: np.ndarray | None = None) -> None:
    """Set an ``Eagle3Draft``'s weights and d2t from a (checked) state (float16 kernel copies tile-major); ``embed``
    [V, H] fills an owned embedding, None for a draft that shares the teacher's."""
    state = check_draft_state(state, draft.config, "<state>")
    if draft.half_matrices is not None:
        inexact = not_float16(state, draft.config)
        if inexact:  # before anything is written
            raise CheckpointError(f"draft weights {', '.join(inexact)} hold values float16 does not represent exactly, "
                                  f"but this draft's kernels read float16 copies: build it with kernel_weight_dtype "
                                  f"'float32'")
    slots = _weight_slots(draft)
    for param, value in params_from_state(slots, lambda key: state[key]):
        param.set_data(Tensor(value, dtype=param.dtype))
    draft.d2t.set_data(Tensor(state["d2t"].astype(np.int32)))
    if draft.half_matrices is not None:
        for half, full in zip(draft.half_matrices.matrices(), draft.float_matrices()):
            half.set_data(Tensor(pack_tiles(full.asnumpy().astype(np.float16))))
    draft.t2d = state["t2d"].astype(bool)  # host-side only (training / analysis); not used by the graph
    if draft.shares_embedding:
        if embed is not None:
            raise ValueError("this draft shares the teacher's embedding: do not pass embed")
        return
    if embed is None:
        raise ValueError("this draft owns its embedding: pass the teacher's model.embed_tokens.weight")
    weight = draft.embed_tokens.weight
    if tuple(np.shape(embed)) != tuple(weight.shape):
        raise CheckpointError(f"teacher embedding has shape {tuple(np.shape(embed))}, the draft needs "
                              f"{tuple(weight.shape)}")
    weight.set_data(Tensor(np.asarray(embed, np.float32), dtype=weight.dtype))


def draft_state(draft) -> dict[str, np.ndarray]:
    """An ``Eagle3Draft``'s checkpoint content as NumPy (float32 weights, d2t int64, t2d bool)."""
    out = {key: value.astype(np.float32) for key, value in state_from_params(_weight_slots(draft)).items()}
    d2t = draft.d2t.asnumpy().astype(np.int64)
    out["d2t"] = d2t
    t2d = getattr(draft, "t2d", None)
    if t2d is None:
        t2d = np.zeros(draft.config.vocab_size, bool)
        t2d[draft_to_target(d2t)] = True
    out["t2d"] = t2d
    return out


def _weight_slots(draft) -> dict:
    """HF key -> Slot of the draft's checkpoint weights (``expected_draft_keys``; not d2t, not the
    embedding), eagle_ms/models/param_layout.py."""
    slots = checkpoint_slots(draft)
    return {key: slots[key] for key in expected_draft_keys(draft.config)}


def numel(cfg: Eagle3Config) -> int:
    """Trainable draft parameters (without the shared embedding)."""
    return sum(math.prod(s) for s in expected_draft_keys(cfg).values())
