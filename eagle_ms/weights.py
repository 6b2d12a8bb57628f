"""Teacher checkpoints: HF/openPangu safetensors <-> the Pangu teacher Cell, with strict, named errors.

Keys are the HF ones (``eagle_ms/models/param_layout.py`` maps each to its place in a Cell parameter:
matrices are stored [in, out] there, q/k/v and gate/up packed):

    model.embed_tokens.weight                          [V, H]
    model.layers.{i}.input_layernorm.weight            [H]
    model.layers.{i}.self_attn.q_proj.weight / .bias   [Hq*D, H] / [Hq*D]    (bias only when cfg.bias)
    model.layers.{i}.self_attn.{k,v}_proj.weight/.bias [Hkv*D, H] / [Hkv*D]
    model.layers.{i}.self_attn.o_proj.weight / .bias   [H, Hq*D] / [H]
    model.layers.{i}.post_attention_layernorm.weight   [H]
    model.layers.{i}.mlp.{gate,up}_proj.weight         [I, H]
    model.layers.{i}.mlp.down_proj.weight              [H, I]
    model.norm.weight                                  [H]
    lm_head.weight                                     [V, H]                (absent when tied)

Linear weights are ``[out, in]`` in the checkpoint, as HF stores them. Rules of ``load_state``:
  * strict: a missing key, an unexpected key or a shape mismatch raises ``CheckpointError`` naming the
    key, the shapes and the source file, before any parameter is changed;
  * values: every float tensor must be finite and, when stored as F16/BF16, plausible for that tag
    (``safetensors_format.check_float_tensor``: catches F16 <-> BF16 relabelled files). All tensors are
    checked before the first parameter is set, so a refused checkpoint leaves the model unchanged. Each
    file is read once: it is memory-mapped once (``SafetensorsFile.view``) and both the check and the
    set read the same mapped bytes (no copy until the conversion to the parameter's dtype; host memory
    beyond the model stays at one tensor), so a file replaced on disk between check and set cannot
    slip unchecked values in;
  * ``*.rotary_emb.inv_freq`` (a buffer openPangu stores) is ignored: RoPE is recomputed from rope_theta;
  * any float dtype (F32/F16/BF16/F64) is converted to the parameter's dtype (BF16 -> F32 is exact);
  * the static KV caches (``*.k_cache`` / ``*.v_cache``) are runtime state, never checkpoint content.

Checkpoint layouts (``load_teacher_checkpoint``): a directory with ``model.safetensors.index.json``
(HF ``{"metadata": {"total_size": n}, "weight_map": {key: shard}}``; it wins when present) or with
``model.safetensors``; or a single ``.safetensors`` / ``.index.json`` file, read by the pure-NumPy reader
of eagle_ms/safetensors_format.py (BF16 widened exactly to float32).
"""
from __future__ import annotations

import json
import math
import os
import re
import zlib
from dataclasses import dataclass
from typing import Mapping

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn

from eagle_ms.config import ModelConfig
from eagle_ms.hf_config import (AUX_IDS_KEY, hf_aux_layer_ids, hf_bias, hf_eos_ids, model_config_to_hf,
                                read_json_object)
from eagle_ms.files import write_json_atomic
from eagle_ms.models.param_layout import FLOAT_DTYPES, checkpoint_slots, params_from_state, state_from_params
from eagle_ms.safetensors_format import (FLOAT_TAGS, SAVE_DTYPES, ST_DTYPES, CheckpointError, SafetensorsFile,
                                         check_float_tensor, write_safetensors)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


# ----------------------------------------------------------------------------------------------
# Expected keys and seeded random weights
# ----------------------------------------------------------------------------------------------

def expected_teacher_keys(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF key -> shape for a teacher of architecture ``cfg``, in checkpoint order (see module doc)."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q_out, kv_out = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    keys = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for n in range(cfg.num_hidden_layers):
        p = f"model.layers.{n}."
        keys[p + "input_layernorm.weight"] = (h,)
        for proj, out, inp in (("q", q_out, h), ("k", kv_out, h), ("v", kv_out, h), ("o", h, q_out)):
            keys[f"{p}self_attn.{proj}_proj.weight"] = (out, inp)
            if cfg.bias:
                keys[f"{p}self_attn.{proj}_proj.bias"] = (out,)
        keys[p + "post_attention_layernorm.weight"] = (h,)
        keys[p + "mlp.gate_proj.weight"] = (i, h)
        keys[p + "mlp.up_proj.weight"] = (i, h)
        keys[p + "mlp.down_proj.weight"] = (h, i)
    keys["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        keys["lm_head.weight"] = (cfg.vocab_size, h)
    return keys


def random_teacher_state(cfg: ModelConfig, seed: int, std: float = 0.02) -> dict[str, np.ndarray]:
    """Seeded float32 weights: N(0, std) matrices, norms 1 + N(0, std), biases N(0, std).

    Every tensor has its own stream ``default_rng([seed, crc32(key)])``: reproducible across machines,
    and a tensor does not change when other keys come or go (e.g. bias on/off, tied head).
    """
    state = {}
    for key, shape in expected_teacher_keys(cfg).items():
        rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
        noise = rng.standard_normal(shape) * std
        state[key] = (1.0 + noise if "norm" in key else noise).astype(np.float32)
    return state


# ----------------------------------------------------------------------------------------------
# Cell <-> state dicts
# ----------------------------------------------------------------------------------------------

def model_state(model: nn.Cell) -> dict[str, np.ndarray]:
    """The model's checkpoint content, HF key -> NumPy copy in the HF layout (bf16 comes back as float32)."""
    return state_from_params(checkpoint_slots(model))


@dataclass(frozen=True)
class CheckpointTensor:
    """One stored tensor: where it is and how to read it (lazily, one tensor at a time)."""

    key: str
    shape: tuple[int, ...]
    dtype: str  # safetensors tag (F32, BF16, ...) or a NumPy dtype name for in-memory arrays
    source: str  # file path, or a label like "<state>"
    file: "SafetensorsFile | None" = None  # read from here ...
    array: np.ndarray | None = None  # ... or this in-memory value

    @property
    def is_float(self) -> bool:
        if self.dtype in ST_DTYPES:
            return self.dtype in FLOAT_TAGS
        return np.dtype(self.dtype).kind == "f"

    def read(self) -> np.ndarray:
        """The value, read-only over the file's memory map (no copy); BF16 widened to float32."""
        return self.array if self.file is None else self.file.view(self.key)


def load_state(model: nn.Cell, state: Mapping[str, np.ndarray], source: str = "<state>") -> None:
    """Strictly load ``state`` (HF key -> array) into ``model``; see the module doc for the rules."""
    entries = {}
    for key, value in state.items():
        arr = np.asarray(value)
        if arr.dtype.name == "bfloat16":  # MindSpore's NumPy bf16 type (Tensor.asnumpy of bf16)
            arr = arr.astype(np.float32)
        entries[key] = CheckpointTensor(key, tuple(arr.shape), arr.dtype.name, source, array=arr)
    _load_entries(model, entries, source)


def _describe(items: list[str], limit: int = 5) -> str:
    more = f" ... (+{len(items) - limit} more)" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more


def _load_entries(model: nn.Cell, entries: Mapping[str, CheckpointTensor], source: str) -> None:
    """Validate every key, shape, dtype and value first, then set the parameters one tensor at a time."""
    slots = checkpoint_slots(model)
    entries = {k: e for k, e in entries.items() if not k.endswith(IGNORED_SUFFIXES)}
    missing = [f"'{k}' (model expects shape {slot.shape})" for k, slot in slots.items() if k not in entries]
    if missing:
        raise CheckpointError(f"checkpoint {source}: missing {len(missing)} key(s): {_describe(missing)}")
    unexpected = [f"'{k}' (shape {e.shape} in {e.source})" for k, e in entries.items() if k not in slots]
    if unexpected:
        raise CheckpointError(f"checkpoint {source}: {len(unexpected)} unexpected key(s) the model does not "
                              f"have: {_describe(unexpected)}")
    bad = [f"'{k}': shape {e.shape} in {e.source} != model shape {slots[k].shape}"
           for k, e in entries.items() if e.shape != slots[k].shape]
    bad += [f"'{k}': dtype {e.dtype} in {e.source} is not a float type (model: {slots[k].param.dtype})"
            for k, e in entries.items() if not e.is_float and slots[k].param.dtype in FLOAT_DTYPES]
    if bad:
        raise CheckpointError(f"checkpoint {source}: {len(bad)} tensor(s) do not fit: {_describe(bad)}")
    for key in slots:
        if entries[key].is_float:
            check_float_tensor(key, entries[key].read(), entries[key].dtype, entries[key].source)
    for param, value in params_from_state(slots, lambda key: entries[key].read()):
        if param.dtype == ms.bfloat16:
            param.set_data(Tensor(value.astype(np.float32), dtype=ms.bfloat16))
        else:
            param.set_data(Tensor(value.astype(ms.dtype_to_nptype(param.dtype))))


# ----------------------------------------------------------------------------------------------
# HF checkpoint directories
# ----------------------------------------------------------------------------------------------

def _index_entries(index_path: str) -> dict[str, CheckpointTensor]:
    try:
        with open(index_path, encoding="utf-8") as fh:
            weight_map = json.load(fh)["weight_map"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index_path}: cannot read the shard index: {exc!r}") from None
    if not (isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values())):
        raise CheckpointError(f"{index_path}: 'weight_map' must map tensor keys to shard file names")
    base, shards, entries = os.path.dirname(index_path), {}, {}
    for key, shard in weight_map.items():
        path = os.path.join(base, shard)
        if path not in shards:
            if not os.path.isfile(path):
                raise CheckpointError(f"{index_path}: shard file {path} (holding '{key}') does not exist")
            shards[path] = SafetensorsFile(path)
        f = shards[path]
        if key not in f.tensors:
            raise CheckpointError(f"{index_path}: key '{key}' is mapped to shard {path}, which does not "
                                  f"contain it")
        tag, shape = f.tensors[key][:2]
        entries[key] = CheckpointTensor(key, shape, tag, path, file=f)
    return entries


def open_checkpoint(path: str) -> dict[str, CheckpointTensor]:
    """Key -> CheckpointTensor (headers only; data is read lazily) for any supported layout."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, INDEX_FILE)):
            return _index_entries(os.path.join(path, INDEX_FILE))
        if os.path.isfile(os.path.join(path, SINGLE_FILE)):
            path = os.path.join(path, SINGLE_FILE)
        else:
            raise CheckpointError(f"checkpoint directory {path} has neither {INDEX_FILE} nor {SINGLE_FILE}")
    elif not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.endswith(".index.json"):
        return _index_entries(path)
    f = SafetensorsFile(path)
    return {k: CheckpointTensor(k, shape, tag, path, file=f) for k, (tag, shape, _, _) in f.tensors.items()}


def load_teacher_checkpoint(model: nn.Cell, path: str) -> None:
    """Strictly load an HF-layout checkpoint (directory, .safetensors file or index) into ``model``."""
    _load_entries(model, open_checkpoint(path), path)


def _plan_shards(sizes: dict[str, int], max_shard_bytes: int | None) -> list[list[str]]:
    """Greedy, in key order: start a new shard when the next tensor would overflow this one."""
    shards, used = [[]], 0
    for key, nbytes in sizes.items():
        if max_shard_bytes is not None and shards[-1] and used + nbytes > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(key)
        used += nbytes
    return shards


def save_teacher_checkpoint(state_or_model, cfg: ModelConfig, out_dir: str, max_shard_bytes: int | None = None,
                            dtype: str = "float32") -> list[str]:
    """Write an HF-layout checkpoint of ``cfg`` to ``out_dir``; return the file names written.

    One ``model.safetensors``, or (when ``max_shard_bytes`` splits it) ``model-0000i-of-0000N.safetensors``
    + ``model.safetensors.index.json``; then ``config.json``. Every file is written to a temp name and
    renamed. Files of the other layout left from an earlier save in ``out_dir`` are removed so the
    directory never holds two disagreeing checkpoints.
    """
    if dtype not in SAVE_DTYPES:
        raise ValueError(f"dtype {dtype!r} must be one of {sorted(SAVE_DTYPES)}")
    if max_shard_bytes is not None and (isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int)
                                        or max_shard_bytes < 1):
        raise ValueError(f"max_shard_bytes {max_shard_bytes!r} must be a positive integer or None")
    state = model_state(state_or_model) if isinstance(state_or_model, nn.Cell) else dict(state_or_model)
    expected = expected_teacher_keys(cfg)
    problems = [f"missing '{k}'" for k in expected if k not in state]
    problems += [f"unexpected '{k}'" for k in state if k not in expected]
    problems += [f"'{k}': shape {tuple(np.shape(state[k]))} != {s}" for k, s in expected.items()
                 if k in state and tuple(np.shape(state[k])) != s]
    if problems:
        raise CheckpointError(f"state does not match the model config: {_describe(problems)}")
    os.makedirs(out_dir, exist_ok=True)
    itemsize = np.dtype(ST_DTYPES[SAVE_DTYPES[dtype]]).itemsize
    shards = _plan_shards({k: math.prod(s) * itemsize for k, s in expected.items()}, max_shard_bytes)
    meta = {"format": "pt"}
    if len(shards) == 1:
        names = [SINGLE_FILE]
        write_safetensors(os.path.join(out_dir, SINGLE_FILE), {k: state[k] for k in expected}, meta, dtype)
    else:
        names, weight_map, total = [], {}, 0
        for i, keys in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            total += write_safetensors(os.path.join(out_dir, name), {k: state[k] for k in keys}, meta, dtype)
            weight_map.update({k: name for k in keys})
            names.append(name)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        _write_json(os.path.join(out_dir, INDEX_FILE), index)
        names.append(INDEX_FILE)
    _remove_stale(out_dir, names)
    _write_json(os.path.join(out_dir, CONFIG_FILE), {**model_config_to_hf(cfg), "torch_dtype": dtype})
    return names + [CONFIG_FILE]


def _write_json(path: str, obj) -> None:
    write_json_atomic(path, obj, indent=2)


def _remove_stale(out_dir: str, keep: list[str]) -> None:
    """Drop checkpoint files of an earlier save (other layout or other shard count)."""
    pattern = re.compile(r"model-\d{5}-of-\d{5}\.safetensors$")
    for name in os.listdir(out_dir):
        if name not in keep and (name in (SINGLE_FILE, INDEX_FILE) or pattern.match(name)):
            os.remove(os.path.join(out_dir, name))


# ----------------------------------------------------------------------------------------------
# Checkpoint config vs model config
# ----------------------------------------------------------------------------------------------

_SAME_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "bias", "tie_word_embeddings", "rope_theta", "rms_norm_eps",
                "max_position_embeddings")


def check_checkpoint_config(cfg: ModelConfig, checkpoint: str) -> None:
    """If ``checkpoint`` is a directory with config.json, it must agree with ``cfg``: the architecture,
    ``max_position_embeddings``, the aux layer ids (``eagle_aux_hidden_state_layer_ids``) and
    ``eos_token_id`` (an HF list of stop ids agrees when it holds ``cfg.eos_token_id``).

    Fields absent from config.json are not compared; HF spellings (``attention_bias`` for ``bias``, ...)
    are read by eagle_ms/hf_config.py. One CheckpointError lists every disagreeing field, both values.
    """
    path = os.path.join(checkpoint, CONFIG_FILE)
    if not (os.path.isdir(checkpoint) and os.path.isfile(path)):
        return
    raw = read_json_object(path)
    theirs = {name: raw.get(name) for name in _SAME_FIELDS}
    theirs["bias"] = hf_bias(raw)
    diffs = [f"{name}: checkpoint {value!r} != config {getattr(cfg, name)!r}" for name, value in theirs.items()
             if value is not None and not _same(value, getattr(cfg, name))]
    ids = hf_aux_layer_ids(raw)
    if ids is not None and ids != tuple(cfg.aux_layer_ids):
        diffs.append(f"{AUX_IDS_KEY}: checkpoint {list(ids) if isinstance(ids, tuple) else ids!r} != config "
                     f"aux_layer_ids {list(cfg.aux_layer_ids)}")
    eos = hf_eos_ids(raw)
    if eos is not None and not any(_same(e, cfg.eos_token_id) for e in eos):
        relation = "does not contain" if isinstance(raw["eos_token_id"], list) else "!="
        diffs.append(f"eos_token_id: checkpoint {raw['eos_token_id']!r} {relation} config {cfg.eos_token_id!r}")
    if diffs:
        raise CheckpointError(f"checkpoint config {path} disagrees with the model config in {len(diffs)} "
                              f"field(s): {'; '.join(diffs)}")


def _same(theirs, ours) -> bool:
    if isinstance(ours, float):
        try:
            return math.isclose(float(theirs), ours, rel_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return theirs == ours and isinstance(theirs, bool) == isinstance(ours, bool)
