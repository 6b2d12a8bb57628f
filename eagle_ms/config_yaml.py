"""MindFormers-style YAML files -> one plain dict: ``base_config`` inheritance, relative paths, ``--set``.

The semantics are MindFormers' own (``MindFormerConfig``), re-implemented here so that reading a config
imports nothing heavy, prints nothing and creates no ``./output/log`` directory (tests/test_config_yaml.py
compares the two on the shipped configs and on inheritance chains):

* ``base_config: other.yaml`` (or a list of files) is relative to the file that names it. The bases are
  merged in order, shallowly (a later base replaces a whole top-level section of an earlier one); then
  the file itself is merged into the result deeply (its keys win, nested mappings merge key by key).
* ``--set a.b.c=value`` overrides build the same nested mapping and merge deeply, as ``merge_from_dict``.

Two things MindFormers does not do, both needed by a config that lives outside the repository:

* a ``base_config`` cycle is an error naming the cycle (MindFormers recurses until the stack overflows);
* the relative paths a file holds (``model.checkpoint``, ``tokenizer.model_file``,
  ``speculative.draft_path``) are resolved against that file's own location, not the location of the
  file that inherits it: against the repository root the file lives under (the directory above its
  ``configs/``), else its own directory (``resolve_path``).
"""
from __future__ import annotations

import os
from typing import Any, Mapping

BASE_CONFIG = "base_config"
PATH_KEYS = (("model", "checkpoint"), ("tokenizer", "model_file"), ("speculative", "draft_path"))
# Top-level sections MindFormers' own runners use; a shared MindFormers YAML may carry them. eagle_ms
# accepts and ignores them; any other unknown section is an error (a typo must not be ignored).
MINDFORMERS_SECTIONS = frozenset((
    "run_mode", "use_legacy", "do_eval", "general_config", "runner_config", "context", "parallel", "trainer",
    "moe_config", "parallel_config", "recompute_config", "swap_config", "runner_wrapper", "optimizer",
    "lr_schedule", "metric", "train_dataset", "train_dataset_task", "callbacks", "monitor_config",
    "eval_dataset", "eval_dataset_task", "eval_callbacks", "processor", "output_dir", "seed", "load_checkpoint",
    "src_strategy_path_or_dir", "auto_trans_ckpt", "only_save_strategy", "resume_training", "use_parallel",
))


def resolve_path(path: str, yaml_file: str) -> str:
    """A relative path written in ``yaml_file``: under the repository root above the file's directory if
    it exists there, else under the file's own directory (where a new file would go)."""
    if os.path.isabs(path):
        return path
    base = os.path.dirname(os.path.abspath(yaml_file))
    for root in (os.path.dirname(base), base):
        candidate = os.path.join(root, path)
        if os.path.exists(candidate):
            return candidate
    return os.path.join(os.path.dirname(base), path)


def _load_one(path: str) -> dict:
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except UnicodeDecodeError as exc:
        raise ValueError(f"config {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"config {path} is not valid YAML: {_one_line(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config {path} must be a mapping of sections, got {type(data).__name__}")
    return data


def _resolve_paths(data: dict, path: str) -> None:
    for section, key in PATH_KEYS:
        block = data.get(section)
        if isinstance(block, dict) and isinstance(block.get(key), str):
            block[key] = resolve_path(block[key], path)


def merge_into(a: Mapping, b: Mapping, where: str = "") -> dict:
    """A copy of ``b`` with ``a`` merged in: ``a``'s values win, mappings present in both merge recursively.

    A mapping merged onto a value that is not one (``generation: 5`` under ``generation.max_new_tokens``)
    raises ValueError naming the key: the damaged value must not be silently replaced."""
    out = dict(b)
    for key, value in a.items():
        name = f"{where}{key}"
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_into(value, out[key], f"{name}.")
        elif isinstance(value, dict) and out.get(key) is not None:
            raise ValueError(f"config key '{name}' = {out[key]!r}: must be a mapping of keys (it gets {value!r})")
        else:
            out[key] = value
    return out


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def read_yaml(path: str, _chain: tuple[str, ...] = ()) -> dict:
    """The merged dict of ``path`` and its ``base_config`` chain, relative paths resolved per file."""
    real = os.path.realpath(path)
    if real in _chain:
        cycle = " -> ".join(os.path.relpath(p) for p in _chain[_chain.index(real):] + (real,))
        raise ValueError(f"base_config cycle: {cycle}")
    if not os.path.isfile(path):
        via = f" (base_config of {_chain[-1]})" if _chain else ""
        raise FileNotFoundError(f"config file not found: {path}{via}")
    data = _load_one(path)
    _resolve_paths(data, path)
    if BASE_CONFIG not in data:
        return data
    bases = data.pop(BASE_CONFIG)
    bases = bases if isinstance(bases, list) else [bases]
    if not all(isinstance(b, str) and b for b in bases):
        raise ValueError(f"config {path}: base_config must be a file name or a list of them, got {bases!r}")
    merged: dict = {}
    for base in bases:
        merged.update(read_yaml(os.path.join(os.path.dirname(path), base), _chain + (real,)))
    return merge_into(data, merged)


def parse_overrides(items) -> dict:
    """``["runtime.seq_length=1024", ...]`` -> ``{"runtime.seq_length": 1024}`` (values parsed as YAML)."""
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"override {item!r}: expected KEY=VALUE, e.g. runtime.seq_length=1024")
        key, value = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ValueError(f"override {item!r}: the key is empty or has an empty part (expected section.key)")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ValueError(f"override {item!r}: the value is not valid YAML ({_one_line(exc)})") from None
    return out


def apply_overrides(data: Mapping, overrides: Mapping[str, Any]) -> dict:
    """``data`` with dotted ``overrides`` merged in deeply (MindFormers' ``merge_from_dict``)."""
    nested: dict = {}
    for full_key, value in overrides.items():
        if not full_key or any(not part for part in full_key.split(".")):
            raise ValueError(f"override key {full_key!r} is empty or has an empty part (expected section.key)")
        node = nested
        *parents, last = full_key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override key {full_key!r} conflicts with another override of {part!r}")
        node[last] = value
    return merge_into(nested, data)
