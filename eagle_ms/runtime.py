"""From a validated config to ready objects: MindSpore context, teacher runner, tokenizer, drafter.

The library never reads ``sys.argv``; the CLI and scripts call these functions.
"""
from __future__ import annotations

import os

import numpy as np

from eagle_ms.attention import choose_backend
from eagle_ms.config import EagleMsConfig
from eagle_ms.generate import DecodeSettings

ENV_MODE = "EAGLE_MS_MODE"  # reference | performance: overrides speculative.mode


def setup_context(cfg: EagleMsConfig) -> None:
    """Set MindSpore's device and execution mode and the global seeds."""
    import mindspore as ms

    ms.set_device(cfg.runtime.device_target)
    ms.set_context(mode=ms.GRAPH_MODE if cfg.runtime.exec_mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_seed(cfg.runtime.seed)
    np.random.seed(cfg.runtime.seed)


def decode_mode(cfg: EagleMsConfig) -> str:
    """The effective mode: ``EAGLE_MS_MODE`` when set, else ``speculative.mode``."""
    mode = os.environ.get(ENV_MODE, cfg.speculative.mode)
    if mode not in ("reference", "performance"):
        raise ValueError(f"environment {ENV_MODE}={mode!r}: must be 'reference' or 'performance'")
    return mode


def build_runner(cfg: EagleMsConfig):
    """The teacher Cell (checkpoint or seeded random weights) wrapped in a TeacherRunner."""
    from eagle_ms.teacher import TeacherRunner
    from eagle_ms.weights import build_teacher

    backend = choose_backend(decode_mode(cfg), cfg.runtime.device_target, tree=cfg.speculative.draft != "none")
    model = build_teacher(cfg.model, cfg.checkpoint, cfg.runtime.batch_size, cfg.runtime.seq_length,
                          backend, seed=cfg.runtime.seed)
    return TeacherRunner(model, cfg.runtime.prefill_chunk, cfg.speculative.max_depth + 1,
                         cfg.runtime.attention_windows)


def decode_settings(cfg: EagleMsConfig, speculative: bool, run_dir: str | None = None) -> DecodeSettings:
    spec = cfg.speculative
    return DecodeSettings(
        budget=spec.budget if speculative else 0,
        max_depth=spec.max_depth,
        max_new_tokens=cfg.generation.max_new_tokens,
        eos_token_id=cfg.model.eos_token_id if cfg.generation.stop_on_eos else None,
        reference_checks=decode_mode(cfg) == "reference",
        run_dir=run_dir,
        fallback_accept=spec.fallback_accept,
        fallback_steps=spec.fallback_steps,
    )


def load_tokenizer(cfg: EagleMsConfig):
    """The configured SentencePiece tokenizer and chat template, or (None, None) when none is set."""
    if not cfg.tokenizer.model_file:
        return None, None
    from eagle_ms.tokenizer import ChatTemplate, Tokenizer, get_template

    tok = Tokenizer(cfg.tokenizer.model_file)
    tmpl = cfg.tokenizer.chat_template
    template = get_template(tmpl) if isinstance(tmpl, str) else ChatTemplate.from_dict(tmpl)
    return tok, template
