"""The fused draft+verify graph (eagle_ms/models/fused_step.py) and its timing tool
(eagle_ms/bench/fused_step_timing.py): same step as the device step's two calls, and the step's emitted
tokens are the teacher-only greedy continuation. The fused step inside the loop: tests/test_device_loop.py.

A tiny teacher and a random EAGLE-3 draft (as tests/test_device_loop.py). The reference for the tokens is
the host-driven teacher-only loop (``generate`` without a drafter), a second implementation of the decode.
"""
import numpy as np
import pytest
from mindspore import Tensor

from eagle_ms.bench.fused_step_timing import fused_vs_two_calls, state_after_steps
from eagle_ms.device_drafter import DeviceTreeDrafter
from eagle_ms.device_fused import FusedTreeSteps
from eagle_ms.device_verify import DeviceVerifier
from eagle_ms.draft_weights import default_draft_config, load_draft_state, random_draft_state
from eagle_ms.drafting import TreeParams
from eagle_ms.eagle3_drafter import Eagle3Drafter, scratch_size
from eagle_ms.generate import DecodeSettings, generate
from eagle_ms.models.eagle3 import Eagle3Draft
from eagle_ms.models.fused_step import FusedTreeStep
from eagle_ms.models.step_result import unpack_result
from eagle_ms.teacher import TeacherRunner
from helpers_models import TINY, build_teacher, prompt

CAPACITY, CHUNK, DEPTH, BUDGET, NEW_TOKENS = 64, 8, 4, 8, 40
WINDOWS = (16,)  # + the capacity 64
PROMPT = prompt(21, 9)


@pytest.fixture(scope="module")
def parts():
    model, _ = build_teacher(CAPACITY, seed=43)
    runner = TeacherRunner(model, CHUNK, DEPTH + 1, attention_windows=WINDOWS)
    cfg = default_draft_config(TINY, draft_vocab_size=40)
    params = TreeParams(BUDGET, DEPTH, 2)
    draft = Eagle3Draft(cfg, 1, CAPACITY + scratch_size(params, CHUNK), 2, embed=model.model.embed_tokens.weight)
    load_draft_state(draft, random_draft_state(cfg, 3, std=0.3))
    device_tree = DeviceTreeDrafter(Eagle3Drafter(draft, params, CAPACITY, CHUNK, attention_windows=WINDOWS))
    baseline = generate(runner, PROMPT, DecodeSettings(max_depth=DEPTH, max_new_tokens=NEW_TOKENS)).tokens
    return DeviceVerifier(runner, DEPTH), device_tree, baseline


def test_fused_loop_across_windows_equals_teacher_only(parts):
    """The answer crosses from the window 16 to 64: every drafted step is one fused call in the window of
    L' + N (the first tree's L' fits 16, the ones after L' + N > 16 run at 64 for both halves, even while
    L' alone would fit 16), and reference mode checks each tree read back against the host path's, the acceptance against
    greedy_accept and the commit against a sequential re-decode."""
    verifier, device_tree, _ = parts
    reference = DeviceVerifier(verifier.runner, DEPTH, reference=True)
    fused = FusedTreeSteps(device_tree, reference)
    new_tokens = 24
    settings = DecodeSettings(budget=BUDGET, max_depth=DEPTH, max_new_tokens=new_tokens, reference_checks=True)
    short = prompt(22, 3)  # the first tree, at L' = 3, fits the window 16
    res = generate(verifier.runner, short, settings, fused, reference)
    assert res.tokens == generate(verifier.runner, short, DecodeSettings(max_depth=DEPTH,
                                                                         max_new_tokens=new_tokens)).tokens
    assert sorted(w for w, _ in fused.graphs) == [16, 64]
    assert all("draft_verify" in s.stage_s for s in res.steps if s.tree_nodes > 0)


def test_fused_loop_with_shallow_trees_equals_teacher_only(parts):
    """speculative.shallow_depth in the fused step (reference mode): after a step that accepted no draft
    the next tree is TreeParams.shallow(1) (the root's top-2: 2 nodes, N = 3), verified in its own fused
    graph from the full graph's packed result and back; each graph compiles once."""
    verifier, device_tree, baseline = parts
    reference = DeviceVerifier(verifier.runner, DEPTH, reference=True)
    fused = FusedTreeSteps(device_tree, reference)
    shallow = device_tree.params.shallow(1)
    settings = DecodeSettings(budget=BUDGET, max_depth=DEPTH, max_new_tokens=NEW_TOKENS, reference_checks=True,
                              shallow=shallow)
    res = generate(verifier.runner, PROMPT, settings, fused, reference)
    assert res.tokens == baseline
    sizes = [s.tree_nodes for s in res.steps if s.tree_nodes > 0]
    assert sizes[0] == BUDGET and 2 in sizes, sizes
    for prev, step in zip(res.steps, res.steps[1:]):
        assert step.tree_nodes == (2 if prev.accepted_len < 1 else BUDGET)
    assert {p for _, p in fused.graphs} >= {shallow}
    assert all(len(g.compile_cache) == 1 for g in fused.graphs.values())


@pytest.mark.parametrize("warm_steps", [1, 3])
def test_fused_step_emits_the_teacher_only_continuation(parts, warm_steps):
    verifier, device_tree, baseline = parts
    result, aux, prev, length = state_after_steps(verifier, device_tree, PROMPT, warm_steps)
    assert prev < length <= PROMPT.size + 1 + warm_steps * (DEPTH + 1)
    window = verifier.runner.attention_width(length + BUDGET + 1)
    fused = FusedTreeStep(device_tree.graph(window), verifier.verify_step(window, BUDGET + 1))
    (step,) = unpack_result(fused(result, aux, Tensor(np.array([prev], np.int32)))[0].asnumpy())
    done = length - PROMPT.size + 1  # answer tokens so far: the committed ones and the root
    assert list(step.tokens) == baseline[done:done + step.accepted_len + 1]
    verifier.runner.reset()


def test_fused_graph_needs_one_window_for_both_halves(parts):
    verifier, device_tree, _ = parts
    small, large = verifier.runner.attention_windows
    with pytest.raises(ValueError, match=f"draft window {small} != verify window {large}"):
        FusedTreeStep(device_tree.graph(small), verifier.verify_step(large, BUDGET + 1))


def test_timing_arms_agree_and_are_timed(parts):
    verifier, device_tree, _ = parts
    out = fused_vs_two_calls(verifier, device_tree, PROMPT, warm_steps=2, repeats=2, rounds=2)
    assert out["results_equal"] is True
    assert out["two_calls_ms"] > 0 and out["fused_ms"] > 0 and out["decode_ms"] > 0 and out["context"] > PROMPT.size
    assert out["fused_over_decode"] == out["fused_ms"] / out["decode_ms"]
    assert verifier.runner.length == 0  # the runner is left reset
    with pytest.raises(ValueError, match="warm_steps=0"):
        fused_vs_two_calls(verifier, device_tree, PROMPT, warm_steps=0, repeats=1, rounds=1)
