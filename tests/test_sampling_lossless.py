"""Identity at T > 0: seeded speculative sampling == seeded teacher-only sampling, token for token.

The compiled tiny teacher (tests/helpers_models.py) decodes with position-keyed sampling; the teacher-only
run of the same loop (no drafter) is the reference. Grid: T in {0.5, 1.0, 1.5} x top-p in {1.0, 0.9} x
top-k in {0, 20} (all 12 cells), and per cell a covering design over seeds x budgets: two (seed, budget)
pairs per cell, budgets M in {1, 4, 16} rotating so every budget meets every T, every top-p and every
top-k, depths 4 and 10 alternating; each pair runs the test drafter (eagle_ms/oracle_drafter.py, trees
around the sampled answer) and a random-weight EAGLE-3 draft (tests/test_eagle3_lossless.py ``World``).
Then reference mode (commit equivalence every step), the low-acceptance fallback, EOS and KV-capacity
stops at T > 0, and the CLI end to end (flag parsing: tests/test_cli.py).
"""
import json

import pytest

from eagle_ms.config import SamplingParams
from eagle_ms.generate import DecodeSettings, generate
from eagle_ms.oracle_drafter import OracleDrafter
from helpers_models import TINY, build_teacher, make_runner
from test_eagle3_lossless import CLI_CONFIG, PROMPTS, World

NEW_TOKENS = 20
GRID = [(t, p, k) for t in (0.5, 1.0, 1.5) for p in (1.0, 0.9) for k in (0, 20)]
BUDGETS = (1, 4, 16)


@pytest.fixture(scope="module")
def world():
    return World()


def _pairs(cell: int):
    """The covering design: (prompt, seed, budget, depth) for the two runs of grid cell ``cell``."""
    return [((cell + j) % len(PROMPTS), 100 * cell + j, BUDGETS[(cell + 2 * j) % 3], (4, 10)[(cell + j) % 2])
            for j in range(2)]


def _teacher_only(world, i, params, max_new=NEW_TOKENS, eos=None):
    settings = DecodeSettings(max_new_tokens=max_new, eos_token_id=eos, sampling=params)
    return generate(world.runners[1], PROMPTS[i], settings)


def _oracle(base_tokens, budget, depth, seed):
    return OracleDrafter(base_tokens, TINY.vocab_size, budget, depth, error_rate=0.3, branching=2, seed=seed)


def test_the_design_covers_every_budget_with_every_setting():
    seen = {(GRID[c][axis], b) for c in range(len(GRID)) for _, _, b, _ in _pairs(c) for axis in range(3)}
    assert seen == {(v, b) for axis in range(3) for v in {g[axis] for g in GRID} for b in BUDGETS}


@pytest.mark.parametrize("cell", range(len(GRID)))
def test_seeded_speculative_equals_seeded_teacher_only(world, cell):
    temperature, top_p, top_k = GRID[cell]
    accepted = []
    for i, seed, budget, depth in _pairs(cell):
        params = SamplingParams(temperature, top_k, top_p, seed)
        base = _teacher_only(world, i, params)
        assert base.tokens != world.baseline(i).tokens[:len(base.tokens)]  # sampled, not greedy
        settings = DecodeSettings(budget=budget, max_depth=depth, max_new_tokens=NEW_TOKENS, sampling=params)
        for drafter in (_oracle(base.tokens, budget, depth, seed), world.drafter(budget, depth, 4, seed)):
            res = generate(world.runners[depth], PROMPTS[i], settings, drafter)
            assert res.tokens == base.tokens, (GRID[cell], seed, budget, depth, type(drafter).__name__)
            accepted += res.accepted_lengths
    assert max(accepted) >= 1


def test_other_seeds_give_other_samples(world):
    outs = {tuple(_teacher_only(world, 1, SamplingParams(1.0, 0, 1.0, seed)).tokens) for seed in range(4)}
    assert len(outs) == 4


def test_reference_mode_fallback_and_eos_at_t_above_zero(world):
    """Commit equivalence every step (reference mode), the fallback's teacher-only steps, and an EOS
    taken from the sampled answer: the outputs stop at the same token."""
    params = SamplingParams(1.0, 20, 0.9, 7)
    base = _teacher_only(world, 2, params)
    eos = base.tokens[6]
    cut = _teacher_only(world, 2, params, eos=eos)
    assert cut.tokens == base.tokens[:base.tokens.index(eos) + 1] and cut.stop_reason == "eos"
    for fallback in ((0.0, 16), (float("inf"), 2)):
        for eos_id, ref in ((None, base), (eos, cut)):
            settings = DecodeSettings(budget=16, max_depth=10, max_new_tokens=NEW_TOKENS, eos_token_id=eos_id,
                                      reference_checks=True, fallback_accept=fallback[0],
                                      fallback_steps=fallback[1], sampling=params)
            res = generate(world.runners[10], PROMPTS[2], settings, _oracle(base.tokens, 16, 10, 3))
            assert res.tokens == ref.tokens and res.stop_reason == ref.stop_reason


def test_kv_capacity_stop_at_t_above_zero():
    """Near capacity the loop takes N = 1 steps: the sampled output stops exactly where teacher-only does."""
    model, _ = build_teacher(40, seed=31)
    runner = make_runner(model, prefill_chunk=8, max_depth=4)
    params = SamplingParams(1.2, 0, 0.9, 5)
    base = generate(runner, PROMPTS[2], DecodeSettings(max_new_tokens=60, sampling=params))
    assert base.stop_reason == "capacity"
    settings = DecodeSettings(budget=8, max_depth=4, max_new_tokens=60, sampling=params)
    res = generate(runner, PROMPTS[2], settings, _oracle(base.tokens, 8, 4, 1))
    assert res.tokens == base.tokens and res.stop_reason == "capacity"


def test_cli_sampling_flags(tmp_path, capsys):
    """``--temperature --top-p --sample-top-k --seed`` reach the loop: teacher-only == ``--draft test``
    (reference mode) under one seed, and the answer is not the greedy one."""
    from eagle_ms.cli import main

    (tmp_path / "tiny.yaml").write_text(CLI_CONFIG)
    common = ["generate", "--config", str(tmp_path / "tiny.yaml"), "--prompt-ids", "5,6,7,8,9,10,11",
              "--max-new-tokens", "16", "--json", "--set", "generation.stop_on_eos=false", "--no-warmup",
              "--temperature", "0.9", "--top-p", "0.9", "--sample-top-k", "20", "--seed", "5"]

    def run(*extra):
        assert main(common + list(extra)) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tokens"]

    base = run()
    assert run("--draft", "test", "--budget", "8", "--max-depth", "4", "--mode", "reference") == base
    assert len(base) == 16
