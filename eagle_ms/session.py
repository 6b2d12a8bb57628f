"""A ready-to-use decoding session built from one config: teacher, tokenizer, drafter, settings.

``Session.generate`` is what the CLI and the benchmark call; it returns a plain dict (JSON-ready) so
every front end reports the same fields, with metrics as defined in ``eagle_ms.generate``:
``tau`` = mean tokens per verify step (accepted drafts + 1 bonus).
"""
from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from eagle_ms.config import EagleMsConfig
from eagle_ms.generate import GenerationResult, generate
from eagle_ms.runtime import build_runner, decode_mode, decode_settings, load_tokenizer


class Session:
    """``run_dir``: where failure dumps (malformed trees, invariant failures) are written; None = no dumps."""

    def __init__(self, cfg: EagleMsConfig, run_dir: str | None = None):
        self.cfg = cfg
        self.mode = decode_mode(cfg)
        self.tokenizer, self.template = load_tokenizer(cfg)
        if self.tokenizer is not None and self.tokenizer.vocab_size > cfg.model.vocab_size:
            raise ValueError(f"tokenizer {cfg.tokenizer.model_file} has {self.tokenizer.vocab_size} pieces but "
                             f"model.model_config.vocab_size is {cfg.model.vocab_size}")
        self.runner = build_runner(cfg)
        self.speculative = cfg.speculative.draft != "none"
        self.settings = decode_settings(cfg, self.speculative, run_dir)
        self.baseline_settings = decode_settings(cfg, False, run_dir)
        self.eagle3 = None
        if cfg.speculative.draft == "eagle3":
            from eagle_ms.eagle3_drafter import build_eagle3_drafter

            self.eagle3 = build_eagle3_drafter(cfg, self.runner)

    def warm_up(self) -> None:
        """Compile every graph a generation will use (prefill chunk, N=1, N=budget+1, cache mover)."""
        sizes = {1, self.settings.budget + 1} if self.speculative else {1}
        self.runner.warm_up(sorted(sizes))
        if self.eagle3 is not None:
            self.eagle3.warm_up()

    def make_drafter(self, prompt_ids, baseline_tokens=None) -> object | None:
        """The configured drafter for one prompt.

        The test drafter needs the teacher-only answer: pass ``baseline_tokens`` when already known, else
        it is generated here (untimed). Its seed mixes ``runtime.seed`` with the prompt, so acceptance
        patterns differ between prompts.
        """
        spec = self.cfg.speculative
        if spec.draft == "none":
            return None
        if spec.draft == "test":
            from eagle_ms.oracle_drafter import OracleDrafter

            prompt_ids = np.asarray(prompt_ids, dtype=np.int32)
            if baseline_tokens is None:
                baseline_tokens = generate(self.runner, prompt_ids, self.baseline_settings).tokens
            seed = (self.cfg.runtime.seed * 1_000_003 + zlib.crc32(prompt_ids.tobytes())) % (2 ** 32)
            return OracleDrafter(baseline_tokens, self.cfg.model.vocab_size, spec.budget, spec.max_depth,
                                 spec.test_draft_error_rate, spec.test_draft_branching, seed)
        if spec.draft == "eagle3":
            return self.eagle3  # one compiled draft per session; begin() resets it per prompt
        raise ValueError(f"speculative.draft {spec.draft!r} is not available in this build "
                         "(available: none, test, eagle3)")

    def untimed_pair(self, prompt_ids, drafter, tokens: int) -> None:
        """One teacher-only and one speculative run of ``tokens`` new tokens (first-call allocations and
        any lazily built graph happen here, not in a timed run); results are discarded."""
        full, base = self.settings, self.baseline_settings
        self.settings = dataclasses.replace(full, max_new_tokens=tokens)
        self.baseline_settings = dataclasses.replace(base, max_new_tokens=tokens)
        try:
            self.run(prompt_ids)
            self.run(prompt_ids, drafter)
        finally:
            self.settings, self.baseline_settings = full, base

    def run(self, prompt_ids, drafter=None) -> GenerationResult:
        settings = self.settings if drafter is not None else self.baseline_settings
        return generate(self.runner, np.asarray(prompt_ids, dtype=np.int32), settings, drafter)

    def generate(self, prompt_ids, warm_up: bool = True) -> dict:
        """Generate for one prompt; the JSON-ready report (tokens, timing, acceptance)."""
        if warm_up:
            self.warm_up()
        drafter = self.make_drafter(prompt_ids)
        result = self.run(prompt_ids, drafter)
        return report_dict(result, self.mode, self.cfg.speculative.draft)


def report_dict(result: GenerationResult, mode: str, draft: str) -> dict:
    return {
        "prompt_tokens": result.prompt_tokens,
        "tokens": result.tokens,
        "tokens_per_s": result.tokens_per_s,
        "stop_reason": result.stop_reason,
        "verify_steps": result.verify_steps,
        "accepted_lengths": result.accepted_lengths,
        "tau": result.tau,
        "prefill_s": result.prefill_s,
        "total_s": result.total_s,
        "mode": mode,
        "draft": draft,
    }
