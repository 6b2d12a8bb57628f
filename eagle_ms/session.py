"""A ready-to-use decoding session built from one config: teacher, tokenizer, drafter, settings.

``Session.generate`` is what the CLI calls; it returns a plain dict (JSON-ready) so every front end
reports the same fields, with metrics as defined in eagle_ms/metrics.py: ``tau`` = mean tokens per verify
step (accepted drafts + 1 bonus). ``Session.run`` is what the benchmark calls; per-call changes to the
decode settings are keyword overrides (``max_new_tokens=8``, ``run_dir=...``), never a swap of shared
state.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from eagle_ms.config import DEVICE_STEPS, EagleMsConfig
from eagle_ms.device_drafter import DeviceTreeDrafter
from eagle_ms.device_fused import FusedTreeSteps
from eagle_ms.device_verify import DeviceVerifier
from eagle_ms.generate import GenerationResult, generate
from eagle_ms.runtime import (build_eagle3_drafter, build_runner, build_test_drafter, decode_mode, decode_settings,
                              load_tokenizer)

COST_PROBE_TOKENS = 8  # teacher-only tokens Session.generate decodes (untimed) to measure t_dec for "auto"


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
        self.settings = decode_settings(cfg, run_dir)
        self.eagle3 = build_eagle3_drafter(cfg, self.runner) if cfg.speculative.draft == "eagle3" else None
        self.device = cfg.speculative.step in DEVICE_STEPS
        self.device_tree = DeviceTreeDrafter(self.eagle3) if self.device and self.eagle3 is not None else None
        self.fused = cfg.speculative.step == "fused" and self.device_tree is not None
        self._verifiers: dict = {}  # SamplingParams -> DeviceVerifier (the sampling rule is compiled in)
        self._fused_steps: dict = {}  # SamplingParams -> FusedTreeSteps over that verifier

    def verifier(self, sampling) -> DeviceVerifier | None:
        """The device verifier for ``sampling`` (built on first use), or None for ``speculative.step: host``."""
        if not self.device:
            return None
        if sampling not in self._verifiers:
            self._verifiers[sampling] = DeviceVerifier(self.runner, self.settings.max_depth,
                                                       self.mode == "reference", sampling)
        return self._verifiers[sampling]

    def fused_steps(self, sampling) -> FusedTreeSteps:
        """The fused draft+verify graphs over ``self.verifier(sampling)`` (``speculative.step: fused``)."""
        if sampling not in self._fused_steps:
            self._fused_steps[sampling] = FusedTreeSteps(self.device_tree, self.verifier(sampling))
        return self._fused_steps[sampling]

    def warm_up(self, two_calls: bool = False) -> None:
        """Compile every graph a generation will use (prefill chunk, N=1, N=budget+1 or the fused draft+verify
        graphs, the draft graphs, cache mover; each twice, full and shallow, with ``speculative.shallow_depth``).
        ``two_calls``: a fused session also compiles the two-call step's graphs (``run(two_calls=True)``)."""
        shallow = self.settings.shallow  # the low-acceptance tree's graphs too (speculative.shallow_depth)
        apart = not self.fused or two_calls  # the verify graphs called on their own
        sizes = {1, self.settings.budget + 1} if self.speculative and apart else {1}
        if shallow is not None and apart:
            sizes.add(shallow.budget + 1)
        verifier = self.verifier(self.settings.sampling)
        if verifier is None:
            self.runner.warm_up(sorted(sizes))
        else:  # the host prefill chunk (+ N = 1 for the reference re-decode), then the device graphs
            self.runner.warm_up([1] if self.mode == "reference" else [])
            verifier.warm_up(sorted(sizes))
        if self.eagle3 is not None:
            self.eagle3.warm_up()
        trees = (None,) if shallow is None else (None, shallow)
        for tree in trees if self.device_tree is not None else ():
            if self.fused:
                self.fused_steps(self.settings.sampling).warm_up(tree)
            if apart:
                self.device_tree.warm_up(params=tree)

    def make_drafter(self, prompt_ids, baseline_tokens=None) -> object | None:
        """The configured drafter for one prompt (None for ``draft: none``).

        The test drafter needs the teacher-only answer: pass ``baseline_tokens`` when already known, else
        it is generated here (untimed).
        """
        draft = self.cfg.speculative.draft
        if draft == "none":
            return None
        if draft == "test":
            if baseline_tokens is None:
                baseline_tokens = self.run(prompt_ids).tokens
            return build_test_drafter(self.cfg, prompt_ids, baseline_tokens)
        # one compiled draft per session; begin() resets it per prompt
        return self.device_tree if self.device_tree is not None else self.eagle3

    def untimed_pair(self, prompt_ids, drafter, tokens: int) -> None:
        """One teacher-only and one speculative run of ``tokens`` new tokens (first-call allocations and
        any lazily built graph happen here, not in a timed run); results are discarded."""
        self.run(prompt_ids, max_new_tokens=tokens)
        self.run(prompt_ids, drafter, max_new_tokens=tokens)

    def run(self, prompt_ids, drafter=None, two_calls: bool = False, **overrides) -> GenerationResult:
        """One generation; ``overrides`` replace fields of ``self.settings`` for this call only. A fused
        session verifies its device tree in the draft's graph call unless ``two_calls``: then as the
        two-call device step (draft graph, verify graph: the same trees, the verify timed apart)."""
        settings = dataclasses.replace(self.settings, **overrides) if overrides else self.settings
        if self.fused and drafter is self.device_tree and not two_calls:
            drafter = self.fused_steps(settings.sampling)  # the same draft, verified in the same graph call
        return generate(self.runner, np.asarray(prompt_ids, dtype=np.int32), settings, drafter,
                        self.verifier(settings.sampling))

    def generate(self, prompt_ids, warm_up: bool = True) -> dict:
        """Generate for one prompt; the JSON-ready report (tokens, timing, acceptance). A bad prompt is
        refused before any graph is compiled; it is checked once (``TeacherRunner.check_prompt``: the
        prefills of the checked array do not check it again)."""
        prompt_ids = self.runner.check_prompt(prompt_ids)
        if warm_up:
            self.warm_up()
        drafter = self.make_drafter(prompt_ids)
        costs = self.settings.step_costs
        if drafter is not None and costs is not None and costs.seconds["decode"] is None:
            self.run(prompt_ids, max_new_tokens=COST_PROBE_TOKENS)  # untimed: t_dec for fallback_accept auto
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
        "fallback_bar": result.fallback_bar,
        "mode": mode,
        "draft": draft,
    }
