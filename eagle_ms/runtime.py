"""Every factory from a validated config to ready objects: MindSpore context, teacher Cell and runner,
decode settings, tokenizer, and drafters (EAGLE-3 and the test drafter).

The library never reads ``sys.argv``; the CLI and scripts call these functions. Shipped assets named by
the config (teacher checkpoint, tokenizer, draft) are checked against their manifest here, where they are
loaded (eagle_ms/assets.py).
"""
from __future__ import annotations

import os
import zlib

import numpy as np

from eagle_ms.assets import check_shipped
from eagle_ms.config import FALLBACK_AUTO, EagleMsConfig, ModelConfig
from eagle_ms.drafting import TreeParams
from eagle_ms.fallback import StepCosts
from eagle_ms.generate import DecodeSettings
from eagle_ms.models.attention import choose_backend
from eagle_ms.models.cpu_kernels import choose_kernels

ENV_MODE = "EAGLE_MS_MODE"  # reference | performance: overrides speculative.mode


def setup_context(cfg: EagleMsConfig) -> None:
    """Set MindSpore's device and execution mode, its dispatch and CPU kernel threads and the global seeds."""
    import mindspore as ms

    ms.set_device(cfg.runtime.device_target)
    ms.set_context(mode=ms.GRAPH_MODE if cfg.runtime.exec_mode == "graph" else ms.PYNATIVE_MODE)
    if cfg.runtime.dispatch_threads is not None:
        set_dispatch_threads(cfg.runtime.dispatch_threads)
    if cfg.runtime.op_threads is not None:
        set_op_threads(cfg.runtime.op_threads)
    ms.set_seed(cfg.runtime.seed)
    np.random.seed(cfg.runtime.seed)


_THREADS_SET: dict[str, int] = {}  # config key -> the value this process set (MindSpore accepts one call each)


def _set_threads_once(key: str, threads: int, setter) -> None:
    """``setter(threads)`` once per process for config key ``key``: MindSpore refuses a second call, so
    asking again for the same number is a no-op and asking for another one is an error naming the key."""
    if key in _THREADS_SET:
        if _THREADS_SET[key] != threads:
            raise ValueError(f"config key '{key}' = {threads}: this process already runs "
                             f"with {_THREADS_SET[key]} (MindSpore sets it once per process)")
        return
    setter(threads)
    _THREADS_SET[key] = threads


def set_dispatch_threads(threads: int) -> None:
    """``mindspore.runtime.dispatch_threads_num(threads)``, once per process (``_set_threads_once``).

    MindSpore's default pool has 5 threads. On the 2-core CPU, 2 threads made one warm graph called
    repeatedly 0.7x as long, but a whole speculative generation 1.9x as long (docs/teacher_profile.md):
    measure the loop, not one call, before setting it."""
    import mindspore as ms

    _set_threads_once("runtime.dispatch_threads", threads, ms.runtime.dispatch_threads_num)


def set_op_threads(threads: int) -> None:
    """``mindspore.device_context.cpu.op_tuning.threads_num(threads)``, once per process
    (``_set_threads_once``). On the 2-core CPU 1 and 2 threads timed the same as the default
    (docs/results.md §"What the speedup bars need on this CPU")."""
    import mindspore as ms

    _set_threads_once("runtime.op_threads", threads, ms.device_context.cpu.op_tuning.threads_num)


def decode_mode(cfg: EagleMsConfig) -> str:
    """The effective mode: ``EAGLE_MS_MODE`` when set, else ``speculative.mode``."""
    mode = os.environ.get(ENV_MODE, cfg.speculative.mode)
    if mode not in ("reference", "performance"):
        raise ValueError(f"environment {ENV_MODE}={mode!r}: must be 'reference' or 'performance'")
    return mode


def kernels_for(cfg: EagleMsConfig) -> str:
    """The layers' kernels for this run's inference graphs: ``choose_kernels`` of ``runtime.kernels``."""
    return choose_kernels(cfg.runtime.kernels, cfg.runtime.device_target, cfg.model.compute_dtype)


def build_teacher(cfg: ModelConfig, checkpoint: str | None, batch: int, capacity: int, backend: str,
                  seed: int = 0, kernels: str = "composite"):
    """The Pangu teacher Cell with weights: from ``checkpoint`` (its config.json must agree with ``cfg``),
    else ``weights.random_teacher_state(cfg, seed)``. ``kernels``: see ``kernels_for``."""
    from eagle_ms.models.pangu import PanguForCausalLM
    from eagle_ms.weights import check_checkpoint_config, load_state, load_teacher_checkpoint, random_teacher_state

    if checkpoint is not None:
        check_shipped(checkpoint)
        check_checkpoint_config(cfg, checkpoint)
    model = PanguForCausalLM(cfg, batch, capacity, backend, kernels)
    if checkpoint is not None:
        load_teacher_checkpoint(model, checkpoint)
    else:
        load_state(model, random_teacher_state(cfg, seed), source=f"<random seed={seed}>")
    return model


def build_runner(cfg: EagleMsConfig):
    """The teacher Cell (checkpoint or seeded random weights) wrapped in a TeacherRunner."""
    from eagle_ms.teacher import TeacherRunner

    backend = choose_backend(decode_mode(cfg), cfg.runtime.device_target, tree=cfg.speculative.draft != "none")
    model = build_teacher(cfg.model, cfg.checkpoint, cfg.runtime.batch_size, cfg.runtime.seq_length,
                          backend, seed=cfg.runtime.seed, kernels=kernels_for(cfg))
    return TeacherRunner(model, cfg.runtime.prefill_chunk, cfg.speculative.max_depth + 1,
                         cfg.runtime.attention_windows)


def decode_settings(cfg: EagleMsConfig, run_dir: str | None = None) -> DecodeSettings:
    """The settings of one generation. ``budget`` matters only when a drafter is given to ``generate``
    (without one the tree is the root alone), so teacher-only and speculative runs share them, the
    sampling parameters (and seed) included."""
    spec = cfg.speculative
    return DecodeSettings(
        budget=spec.budget,
        max_depth=spec.max_depth,
        max_new_tokens=cfg.generation.max_new_tokens,
        eos_token_id=cfg.model.eos_token_id if cfg.generation.stop_on_eos else None,
        reference_checks=decode_mode(cfg) == "reference",
        run_dir=run_dir,
        fallback_accept=spec.fallback_accept,
        fallback_steps=spec.fallback_steps,
        step_costs=StepCosts() if spec.fallback_accept == FALLBACK_AUTO else None,
        sampling=cfg.generation.sampling,
        shallow=shallow_tree(spec),
    )


def shallow_tree(spec) -> TreeParams | None:
    """The tree after a low-acceptance step (``speculative.shallow_depth``, eagle_ms/depth_policy.py), or None
    when the key is null or there is no draft."""
    if spec.shallow_depth is None or spec.draft == "none":
        return None
    return TreeParams(spec.budget, spec.max_depth, spec.top_k, spec.min_path_prob).shallow(spec.shallow_depth)


def load_tokenizer(cfg: EagleMsConfig):
    """The configured SentencePiece tokenizer and chat template, or (None, None) when none is set."""
    if not cfg.tokenizer.model_file:
        return None, None
    from eagle_ms.tokenizer import ChatTemplate, Tokenizer, get_template

    check_shipped(cfg.tokenizer.model_file)
    tok = Tokenizer(cfg.tokenizer.model_file)
    tmpl = cfg.tokenizer.chat_template
    template = get_template(tmpl) if isinstance(tmpl, str) else ChatTemplate.from_dict(tmpl)
    return tok, template


def eagle3_drafter_from_state(runner, draft_cfg, state: dict, budget: int, max_depth: int, top_k: int,
                              context_window: int | None = None, backend: str = "eager",
                              min_path_prob: float = 0.0, kernels: str | None = None,
                              score_temperature: float = 1.0):
    """An Eagle3Drafter for a TeacherRunner from a draft config + state (e.g. ``load_draft_checkpoint``).

    Shares the teacher's embedding Parameter (the draft's hidden size must equal the teacher's), sizes
    the draft cache as scratch + teacher capacity and uses the runner's attention windows. ``kernels``:
    the teacher's when None. ``score_temperature`` T: the drafter's log-probs are those of logits / T
    (``draft_weights.with_score_temperature``). The layer kernels read the weight matrices as float16 when
    every one of them is exactly float16 (the same results, half the bytes: ``Eagle3Draft``
    ``kernel_weight_dtype``), else as float32.
    """
    from eagle_ms.draft_weights import (check_draft_matches_teacher, load_draft_state, not_float16,
                                        with_score_temperature)
    from eagle_ms.eagle3_drafter import Eagle3Drafter, scratch_size
    from eagle_ms.models.eagle3 import Eagle3Draft

    teacher = runner.model.config
    check_draft_matches_teacher(draft_cfg, teacher)
    params = TreeParams(budget, max_depth, top_k, min_path_prob)
    params.check_fits(draft_cfg.draft_vocab_size, runner.capacity)
    capacity = runner.capacity + scratch_size(params, runner.prefill_chunk)
    state = with_score_temperature(state, score_temperature)
    draft = Eagle3Draft(draft_cfg, 1, capacity, top_k, backend, teacher.compute_dtype,
                        embed=runner.model.model.embed_tokens.weight,
                        kernels=runner.model.kernels if kernels is None else kernels,
                        kernel_weight_dtype="float32" if not_float16(state, draft_cfg) else "float16")
    draft.set_train(False)
    load_draft_state(draft, state)
    return Eagle3Drafter(draft, params, runner.capacity, runner.prefill_chunk, context_window,
                         attention_windows=runner.attention_windows)


def build_eagle3_drafter(cfg: EagleMsConfig, runner):
    """The configured EAGLE-3 drafter (``speculative.draft: eagle3``): loads ``speculative.draft_path``
    (checked against the teacher) and applies budget / max_depth / top_k / draft_window / min_path_prob /
    score_temperature."""
    from eagle_ms.draft_weights import load_draft_checkpoint

    spec = cfg.speculative
    check_shipped(spec.draft_path)
    draft_cfg, state = load_draft_checkpoint(spec.draft_path, cfg.model)
    backend = choose_backend(decode_mode(cfg), cfg.runtime.device_target, tree=True)
    return eagle3_drafter_from_state(runner, draft_cfg, state, spec.budget, spec.max_depth, spec.top_k,
                                     spec.draft_window, backend, spec.min_path_prob,
                                     score_temperature=spec.score_temperature)


def build_test_drafter(cfg: EagleMsConfig, prompt_ids: np.ndarray, baseline_tokens):
    """The test drafter (``speculative.draft: test``) around the teacher-only answer ``baseline_tokens``.

    Its seed mixes ``runtime.seed`` with the prompt, so acceptance patterns differ between prompts.
    """
    from eagle_ms.oracle_drafter import OracleDrafter

    spec = cfg.speculative
    prompt_ids = np.asarray(prompt_ids, dtype=np.int32)
    seed = (cfg.runtime.seed * 1_000_003 + zlib.crc32(prompt_ids.tobytes())) % (2 ** 32)
    return OracleDrafter(baseline_tokens, cfg.model.vocab_size, spec.budget, spec.max_depth,
                         spec.test_draft_error_rate, spec.test_draft_branching, seed)
