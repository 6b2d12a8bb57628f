"""Typed, frozen configuration; MindFormers-style YAML is its serialised form.

A YAML file is read with MindFormers' semantics (``base_config`` inheritance, ``--set`` overrides;
eagle_ms/config_yaml.py) and turned into the frozen dataclasses below. Every field is validated; a bad
value raises ``ValueError`` naming the dotted key and the value. Unknown keys inside our sections and
unknown top-level sections raise too (a typo must not be silently ignored); the sections MindFormers'
own runners use are accepted and ignored. Every key is documented in ``configs/README.md``.

Sections (top level of the YAML):
  model.model_config   -> ModelConfig     (teacher architecture; openPangu / HF field names)
  model.checkpoint     -> str | None      (HF-layout safetensors dir or file; None = seeded random init)
  tokenizer            -> TokenizerConfig
  runtime              -> RuntimeConfig   (device, graph/pynative, static shapes)
  generation           -> GenerationConfig
  speculative          -> SpeculativeConfig
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, NoReturn

import numpy as np

from eagle_ms.config_yaml import MINDFORMERS_SECTIONS, apply_overrides, read_yaml, resolve_path

COMPUTE_DTYPES = ("float32", "float16", "bfloat16")
DEVICES = ("CPU", "Ascend", "GPU")
EXEC_MODES = ("graph", "pynative")
KERNELS = ("auto", "composite", "cpu")  # runtime.kernels (eagle_ms/models/cpu_kernels.py)
DECODE_MODES = ("reference", "performance")
DRAFTS = ("none", "test", "eagle3")
STEPS = ("device", "fused", "host")  # speculative.step: where a decode step runs (eagle_ms/generate.py)
DEVICE_STEPS = ("device", "fused")  # the steps driven by device graphs (fused: draft + verify in one call)
FALLBACK_AUTO = "auto"  # speculative.fallback_accept: the bar measured from step times (eagle_ms/fallback.py)
SECTIONS = ("model", "tokenizer", "runtime", "generation", "speculative")


def fail(key: str, value: Any, why: str, kind: str = "config key") -> NoReturn:
    """The one validation error of eagle_ms: ``ValueError("<kind> '<key>' = <value>: <why>")``."""
    raise ValueError(f"{kind} '{key}' = {value!r}: {why}")


def check_int(key: str, value: Any, minimum: int | None = None, optional: bool = False, below: tuple | None = None) -> None:
    """An integer (>= ``minimum``, < ``below`` = (limit, its name): when given); ``optional``: None passes too."""
    if optional and value is None:
        return
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        fail(key, value, "must be an integer")
    if minimum is not None and value < minimum:
        fail(key, value, f"must be >= {minimum}")
    if below is not None and value >= below[0]:
        fail(key, value, f"must be < {below[1]} {below[0]}")


def check_choice(key: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        fail(key, value, f"must be one of {list(choices)}")


def check_float(key: str, value: Any) -> None:
    """A finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        fail(key, value, "must be a finite number > 0")


# The speculative.* rules that objects built outside a config (TreeParams, SpeculationGate,
# Eagle3Drafter) apply too: each defined once, here.

def check_tree_shape(budget: Any, max_depth: Any, top_k: Any) -> None:
    """speculative.budget, max_depth, top_k: integers >= 1."""
    check_int("speculative.budget", budget, 1)
    check_int("speculative.max_depth", max_depth, 1)
    check_int("speculative.top_k", top_k, 1)


def check_min_path_prob(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        fail("speculative.min_path_prob", value, "must be a number in [0, 1)")


def check_fallback(min_accept: Any, fallback_steps: Any) -> None:
    """speculative.fallback_accept ('auto' or a number >= 0) and fallback_steps (an integer >= 1)."""
    if min_accept != FALLBACK_AUTO and (isinstance(min_accept, bool) or not isinstance(min_accept, (int, float)) or not min_accept >= 0):
        fail("speculative.fallback_accept", min_accept, "must be 'auto' (measured break-even) or a number >= 0")
    if isinstance(fallback_steps, bool) or not isinstance(fallback_steps, int) or fallback_steps < 1:
        fail("speculative.fallback_steps", fallback_steps, "must be an integer >= 1")


def check_draft_window(value: Any) -> None:
    """speculative.draft_window: None (whole context) or an integer >= 1."""
    check_int("speculative.draft_window", value, 1, optional=True)


SEED_LIMIT = 2 ** 32  # generation.seed is one uint32 word of the sampling hash (eagle_ms/sampling.py)
MIN_TEMPERATURE = 1e-6  # below this (but > 0) logits / T can overflow float32: use 0 (greedy) instead


def check_sampling(temperature: Any, top_k: Any, top_p: Any, seed: Any) -> None:
    """generation.temperature (0 = greedy, else finite >= MIN_TEMPERATURE), top_k (int >= 0, 0 = off), top_p
    (in (0, 1], 1 = off), seed (int in [0, 2**32))."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            temperature == 0 or MIN_TEMPERATURE <= temperature < float("inf")):
        fail("generation.temperature", temperature, f"must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}")
    check_int("generation.top_k", top_k, 0)
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        fail("generation.top_p", top_p, "must be a number in (0, 1]")
    check_int("generation.seed", seed, 0, below=(SEED_LIMIT, "2**32 ="))


@dataclass(frozen=True)
class SamplingParams:
    """The token choice of one generation: greedy (temperature 0) or position-keyed sampling after
    temperature, then top-k, then top-p (the rule: eagle_ms/sampling.py)."""

    temperature: float = 0.0
    top_k: int = 0  # keep the k most likely tokens (ties with the k-th kept too); 0 = off
    top_p: float = 1.0  # keep the most likely tokens up to mass top_p (ties kept too); 1 = off
    seed: int = 0

    def __post_init__(self):
        check_sampling(self.temperature, self.top_k, self.top_p, self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams()


def build_section(cls, data: Mapping[str, Any] | None, prefix: str):
    """Build dataclass ``cls`` from ``data``; unknown keys raise naming ``prefix.key``."""
    if data is not None and not isinstance(data, Mapping):
        fail(prefix, data, "must be a mapping of keys")
    data = dict(data or {})
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        fail(f"{prefix}.{unknown[0]}", data[unknown[0]], f"unknown key (known: {sorted(names)})")
    try:
        return cls(**data)
    except TypeError as exc:  # a required field is missing
        raise ValueError(f"config section '{prefix}': {exc}") from None


@dataclass(frozen=True)
class ModelConfig:
    """Pangu (openPangu-Embedded, Llama-like) teacher architecture. Field names follow the HF config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None  # None -> hidden_size // num_attention_heads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    bias: bool = True  # q/k/v/o projection bias (openPangu: true)
    tie_word_embeddings: bool = False
    compute_dtype: str = "float32"
    aux_layer_ids: tuple[int, int, int] | None = None  # None -> (2, L//2, L-3)
    max_position_embeddings: int = 32768
    bos_token_id: int = 1
    eos_token_id: int = 2
    pad_token_id: int = 0

    def __post_init__(self):
        p = "model.model_config"
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            check_int(f"{p}.{name}", getattr(self, name), 1)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            check_int(f"{p}.{name}", getattr(self, name), 0, below=(self.vocab_size, "vocab_size"))
        if self.num_attention_heads % self.num_key_value_heads:
            fail(f"{p}.num_key_value_heads", self.num_key_value_heads, f"must divide num_attention_heads {self.num_attention_heads}")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                fail(f"{p}.hidden_size", self.hidden_size, f"must be divisible by num_attention_heads {self.num_attention_heads}")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        check_int(f"{p}.head_dim", self.head_dim, 2)
        if self.head_dim % 2:
            fail(f"{p}.head_dim", self.head_dim, "must be even (rotary embedding)")
        check_float(f"{p}.rope_theta", self.rope_theta)
        check_float(f"{p}.rms_norm_eps", self.rms_norm_eps)
        for name in ("bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                fail(f"{p}.{name}", getattr(self, name), "must be true or false")
        check_choice(f"{p}.compute_dtype", self.compute_dtype, COMPUTE_DTYPES)
        object.__setattr__(self, "aux_layer_ids", self._resolve_aux_layers())

    def _resolve_aux_layers(self) -> tuple[int, int, int]:
        """EAGLE-3 convention: hidden states *entering* layers (2, L//2, L-3); clamped for small L."""
        n = self.num_hidden_layers
        ids = self.aux_layer_ids
        if ids is None:
            if n < 3:
                fail("model.model_config.num_hidden_layers", n,
                      "EAGLE-3 needs 3 distinct aux layers: use >= 3 layers or set aux_layer_ids")
            ids = (2, n // 2, n - 3)
            if not ids[0] < ids[1] < ids[2]:  # too few layers for the standard choice (n < 7)
                ids = (0, n // 2, n - 1)
        if not isinstance(ids, (tuple, list)) or len(ids) != 3 or any(
                isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n for i in ids):
            fail("model.model_config.aux_layer_ids", self.aux_layer_ids,
                  f"must be 3 layer indices in [0, {n})")
        ids = tuple(ids)
        if not ids[0] < ids[1] < ids[2]:
            fail("model.model_config.aux_layer_ids", ids, "must be strictly increasing (low, mid, high)")
        return ids

    @property
    def num_kv_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads


@dataclass(frozen=True)
class TokenizerConfig:
    """SentencePiece model file and chat template (a built-in name or a dict, see eagle_ms.tokenizer)."""

    model_file: str | None = None
    chat_template: Any = "openpangu"

    def __post_init__(self):
        if self.model_file is not None and not isinstance(self.model_file, str):
            fail("tokenizer.model_file", self.model_file, "must be a path string or null")
        if not isinstance(self.chat_template, (str, dict)):
            fail("tokenizer.chat_template", self.chat_template, "must be a template name or a mapping")


@dataclass(frozen=True)
class RuntimeConfig:
    """Execution: device, MindSpore mode, and the static shapes every graph is compiled for."""

    device_target: str = "CPU"
    exec_mode: str = "graph"  # graph = GRAPH_MODE (compiled once per shape), pynative = eager
    seq_length: int = 512  # S_max: static KV-cache capacity (prompt + generated + one draft tree)
    batch_size: int = 1
    prefill_chunk: int = 64  # prompts are prefilled in chunks of this many tokens (one compiled graph)
    seed: int = 0
    attention_windows: tuple[int, ...] | None = None  # attend only to slots [0, W), W = smallest window >= L+N
    dispatch_threads: int | None = None  # MindSpore runtime threads (runtime.dispatch_threads_num); None = its default
    op_threads: int | None = None  # MindSpore CPU kernel threads (device_context.cpu.op_tuning.threads_num); None = its default
    kernels: str = "auto"  # fused CPU kernels in performance mode (eagle_ms/models/cpu_kernels.py)

    def __post_init__(self):
        check_choice("runtime.device_target", self.device_target, DEVICES)
        check_choice("runtime.kernels", self.kernels, KERNELS)
        check_choice("runtime.exec_mode", self.exec_mode, EXEC_MODES)
        for key, minimum in (("seq_length", 2), ("batch_size", 1), ("prefill_chunk", 1), ("seed", 0)):
            check_int(f"runtime.{key}", getattr(self, key), minimum)
        for key in ("dispatch_threads", "op_threads"):  # None = MindSpore's default
            check_int(f"runtime.{key}", getattr(self, key), 1, optional=True)
        if self.prefill_chunk > self.seq_length:
            fail("runtime.prefill_chunk", self.prefill_chunk, f"must be <= seq_length {self.seq_length}")
        if self.attention_windows is not None:
            windows = self.attention_windows
            if not isinstance(windows, (list, tuple)) or any(
                    isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= self.seq_length for w in windows):
                fail("runtime.attention_windows", windows, f"must be a list of ints in [1, seq_length {self.seq_length}]")
            object.__setattr__(self, "attention_windows", tuple(sorted(set(windows))))


@dataclass(frozen=True)
class GenerationConfig:
    """Decoding limits and the token choice (temperature 0 = greedy)."""

    max_new_tokens: int = 64
    stop_on_eos: bool = True
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        check_int("generation.max_new_tokens", self.max_new_tokens, 1)
        if not isinstance(self.stop_on_eos, bool):
            fail("generation.stop_on_eos", self.stop_on_eos, "must be true or false")
        check_sampling(self.temperature, self.top_k, self.top_p, self.seed)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Draft and tree budget. ``draft: none`` is teacher-only greedy decoding."""

    draft: str = "none"
    draft_path: str | None = None
    budget: int = 16  # M: non-root draft nodes verified per step
    max_depth: int = 10  # Dmax
    top_k: int = 4
    mode: str = "performance"  # reference | performance (env EAGLE_MS_MODE overrides)
    step: str = "host"  # host: host-driven step | device: draft + verify graphs, tokens to the host | fused: one graph
    draft_window: int | None = None  # keep only the last W tokens of draft context (None = full)
    min_path_prob: float = 0.0  # eagle3: stop drafting deeper once every frontier path's probability < this
    score_temperature: float = 1.0  # eagle3: the tree ranks log_softmax(draft logits / T); < 1 favours deep chains
    shallow_depth: int | None = None  # after a step accepting < this many drafts, draft a tree this deep (None: off)
    fallback_accept: float | str = 0.0  # fall back while mean accept_L < this (0 = off; auto = measured c - 1)
    fallback_steps: int = 16  # teacher-only steps per fallback period before the next speculative probe
    test_draft_error_rate: float = 0.3  # test drafter: chance a draft token is corrupted
    test_draft_branching: int = 2  # test drafter: max children per node

    def __post_init__(self):
        check_choice("speculative.draft", self.draft, DRAFTS)
        check_choice("speculative.mode", self.mode, DECODE_MODES)
        check_choice("speculative.step", self.step, STEPS)
        check_tree_shape(self.budget, self.max_depth, self.top_k)
        check_int("speculative.test_draft_branching", self.test_draft_branching, 1)
        check_draft_window(self.draft_window)
        check_min_path_prob(self.min_path_prob)
        check_float("speculative.score_temperature", self.score_temperature)
        check_int("speculative.shallow_depth", self.shallow_depth, 1, True, (self.max_depth, "speculative.max_depth"))
        check_fallback(self.fallback_accept, self.fallback_steps)
        if not isinstance(self.test_draft_error_rate, (int, float)) or not 0 <= self.test_draft_error_rate <= 1:
            fail("speculative.test_draft_error_rate", self.test_draft_error_rate, "must be in [0, 1]")
        if self.draft == "eagle3" and not self.draft_path:
            fail("speculative.draft_path", self.draft_path, "is required when draft is eagle3")


@dataclass(frozen=True)
class EagleMsConfig:
    """The whole run configuration."""

    model: ModelConfig
    checkpoint: str | None = None
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    source: str | None = None  # the YAML file this came from (for manifests)

    def __post_init__(self):
        spec, rt = self.speculative, self.runtime
        if spec.draft != "none" and spec.budget + 1 > rt.seq_length:
            fail("speculative.budget", spec.budget, f"a tree of budget+1 nodes must fit runtime.seq_length {rt.seq_length}")
        if spec.max_depth + 1 > rt.seq_length:
            fail("speculative.max_depth", spec.max_depth, f"max_depth+1 must fit runtime.seq_length {rt.seq_length}")

    def replace(self, section: str, **changes) -> "EagleMsConfig":
        """A copy with fields of one section changed (validated again)."""
        return dataclasses.replace(self, **{section: dataclasses.replace(getattr(self, section), **changes)})

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return {"model": {"model_config": d["model"], "checkpoint": d["checkpoint"]}, "tokenizer": d["tokenizer"],
                "runtime": d["runtime"], "generation": d["generation"], "speculative": d["speculative"]}


def config_from_dict(data: Mapping[str, Any], source: str | None = None) -> EagleMsConfig:
    """Validate a plain dict (the YAML layout above) into an ``EagleMsConfig``. Relative paths are
    resolved against ``source`` (eagle_ms/config_yaml.py ``resolve_path``)."""
    unknown = sorted(set(data) - set(SECTIONS) - MINDFORMERS_SECTIONS)
    if unknown:
        import difflib

        near = difflib.get_close_matches(unknown[0], SECTIONS, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        fail(unknown[0], data[unknown[0]], f"unknown top-level section{hint}; eagle_ms reads {list(SECTIONS)}")
    for name in SECTIONS:
        if data.get(name) is not None and not isinstance(data[name], Mapping):
            fail(name, data[name], "must be a mapping of keys")
    model_section = dict(data.get("model") or {})
    if "model_config" not in model_section:
        fail("model.model_config", None, "section is required")
    if model_section["model_config"] is not None and not isinstance(model_section["model_config"], Mapping):
        fail("model.model_config", model_section["model_config"], "must be a mapping of keys")
    mc = dict(model_section.pop("model_config") or {})
    mc.pop("type", None)  # MindFormers-style class tag, informational
    if isinstance(mc.get("aux_layer_ids"), list):
        mc["aux_layer_ids"] = tuple(mc["aux_layer_ids"])
    checkpoint = model_section.pop("checkpoint", None)
    model_section.pop("arch", None)
    if model_section:
        key = sorted(model_section)[0]
        fail(f"model.{key}", model_section[key], "unknown key (known: model_config, checkpoint, arch)")
    if source and isinstance(checkpoint, str):
        checkpoint = resolve_path(checkpoint, source)
    tok = dict(data.get("tokenizer") or {})
    if source and isinstance(tok.get("model_file"), str):
        tok["model_file"] = resolve_path(tok["model_file"], source)
    spec = dict(data.get("speculative") or {})
    if source and isinstance(spec.get("draft_path"), str):
        spec["draft_path"] = resolve_path(spec["draft_path"], source)
    return EagleMsConfig(
        model=build_section(ModelConfig, mc, "model.model_config"), checkpoint=checkpoint,
        tokenizer=build_section(TokenizerConfig, tok, "tokenizer"),
        runtime=build_section(RuntimeConfig, data.get("runtime"), "runtime"),
        generation=build_section(GenerationConfig, data.get("generation"), "generation"),
        speculative=build_section(SpeculativeConfig, spec, "speculative"), source=source)


def load_config(path: str, overrides: Mapping[str, Any] | None = None) -> EagleMsConfig:
    """Read a MindFormers-style YAML (``base_config`` inheritance supported) and validate it. ``overrides``
    maps dotted keys to values, e.g. ``{"speculative.budget": 32}``, as MindFormers' ``merge_from_dict``
    does; relative paths among them are resolved against ``path``."""
    return config_from_dict(apply_overrides(read_yaml(path), dict(overrides or {})), source=path)
