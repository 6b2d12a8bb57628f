"""Attention windows: attending only to cache slots [0, W) with W the smallest configured window >= L+N
gives the same outputs as attending to the whole cache, one graph per (N, W)."""
import numpy as np
import pytest

from eagle_ms.generate import DecodeSettings, generate
from eagle_ms.oracle_drafter import OracleDrafter
from eagle_ms.teacher import TeacherRunner
from helpers_models import TINY, build_teacher, prompt

CAPACITY = 64


@pytest.fixture(scope="module")
def models():
    full, state = build_teacher(CAPACITY, seed=7)
    windowed, _ = build_teacher(CAPACITY, state=state)
    return (TeacherRunner(full, 8, 5), TeacherRunner(windowed, 8, 5, attention_windows=(16, 32)))


def test_window_choice_worked_example(models):
    _, runner = models
    assert runner.attention_windows == (16, 32, 64)
    assert [runner.attention_width(e) for e in (1, 16, 17, 32, 33, 64)] == [16, 16, 32, 32, 64, 64]
    with pytest.raises(ValueError, match="KV cache full"):
        runner.attention_width(65)


def test_windowed_prefill_and_decode_equal_full_cache(models):
    full, windowed = models
    ids = prompt(3, 13)
    a, b = full.prefill(ids), windowed.prefill(ids)
    np.testing.assert_allclose(b.logits, a.logits, rtol=1e-5, atol=1e-5)
    tokens = prompt(4, 30)  # crosses the 16 and 32 windows
    a, b = full.decode_chain(tokens), windowed.decode_chain(tokens)
    np.testing.assert_allclose(b.logits, a.logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.aux, a.aux, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("budget, depth", [(4, 4), (8, 3)])
def test_windowed_speculative_output_equals_full_teacher_only(models, budget, depth):
    full, windowed = models
    ids = prompt(5, 9)
    settings = DecodeSettings(max_new_tokens=40, eos_token_id=None)
    base = generate(full, ids, settings)
    drafter = OracleDrafter(base.tokens, TINY.vocab_size, budget, depth, seed=1)
    spec = generate(windowed, ids, DecodeSettings(budget=budget, max_depth=depth, max_new_tokens=40,
                                                  reference_checks=True), drafter)
    assert spec.tokens == base.tokens


def test_warm_up_compiles_every_window_then_generation_compiles_nothing(models):
    _, windowed = models
    windowed.warm_up([1, 5])
    compiled = len(windowed.model.compile_cache)
    ids = prompt(6, 11)
    base = generate(windowed, ids, DecodeSettings(max_new_tokens=45, eos_token_id=None))
    drafter = OracleDrafter(base.tokens, TINY.vocab_size, 4, 4, seed=2)
    generate(windowed, ids, DecodeSettings(budget=4, max_depth=4, max_new_tokens=45), drafter)
    assert len(windowed.model.compile_cache) == compiled
