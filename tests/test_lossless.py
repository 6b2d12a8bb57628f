"""Losslessness: speculative greedy output == teacher-only greedy output, exactly.

The test drafter (OracleDrafter) proposes random trees around the teacher's own greedy continuation
with seeded corruption and branching, so accepted paths have random lengths and are often out of
order (device-copy commits). Whatever the tree, the emitted tokens must equal the teacher-only run of
the same loop (``generate`` without a drafter), for budgets M in {1, 4, 16, 64}, depths Dmax in
{1, 4, 10}, reference mode (invariants + commit-equivalence checks) and performance mode, and for
every stop: max_new_tokens, EOS, KV capacity (near capacity the loop falls back to N = 1).
The teacher-only output itself is checked against a NumPy fp64 greedy decode.
"""
import numpy as np
import pytest

from helpers_models import TINY, build_teacher, make_runner, prompt
from numpy_reference import reference_forward

from eagle_ms.fallback import StepCosts
from eagle_ms.generate import DecodeSettings, generate
from eagle_ms.oracle_drafter import OracleDrafter

NEW_TOKENS = 40
BIG_CAPACITY = 128  # prompt <= 17 + 40 new + N 65 <= 128 for most of a run
SMALL_CAPACITY = 40
PROMPTS = {"p1": prompt(1, 1), "p9": prompt(2, 9), "p17": prompt(3, 17)}
# (seed, error_rate, branching) per drafter run: exact drafts, noisy, very noisy and bushy
DRAFTERS = [(0, 0.3, 2), (1, 0.0, 1), (2, 0.6, 3), (3, 0.15, 4)]


class Teacher:
    """One compiled model per capacity; one runner (commit width Dmax + 1) per depth, sharing it."""

    def __init__(self, capacity, seed):
        self.model, self.state = build_teacher(capacity, seed=seed)
        self.capacity = capacity
        self.runners = {}
        self.baselines = {}

    def runner(self, max_depth):
        if max_depth not in self.runners:
            self.runners[max_depth] = make_runner(self.model, prefill_chunk=8, max_depth=max_depth)
        return self.runners[max_depth]

    def baseline(self, name, max_new=NEW_TOKENS, eos=None):
        key = (name, max_new, eos)
        if key not in self.baselines:
            settings = DecodeSettings(max_new_tokens=max_new, eos_token_id=eos)
            self.baselines[key] = generate(self.runner(1), PROMPTS[name], settings)
        return self.baselines[key]


@pytest.fixture(scope="module")
def big():
    return Teacher(BIG_CAPACITY, seed=31)


@pytest.fixture(scope="module")
def small():
    return Teacher(SMALL_CAPACITY, seed=31)  # same weights as `big`


def speculate(teacher, name, budget, max_depth, reference, drafter_cfg, max_new=NEW_TOKENS, eos=None,
              continuation=None):
    seed, error_rate, branching = drafter_cfg
    if continuation is None:
        continuation = teacher.baseline(name).tokens
    drafter = OracleDrafter(continuation, TINY.vocab_size, budget, max_depth, error_rate=error_rate,
                            branching=branching, seed=seed)
    settings = DecodeSettings(budget=budget, max_depth=max_depth, max_new_tokens=max_new, eos_token_id=eos,
                              reference_checks=reference)
    return generate(teacher.runner(max_depth), PROMPTS[name], settings, drafter)


def check_steps(result, budget, max_depth):
    for step in result.steps:
        assert 0 <= step.tree_nodes <= budget and step.tree_depth <= max_depth
        assert 0 <= step.accepted_len <= min(max_depth, step.tree_nodes)
        assert step.accepted_path[0] == 0 and len(step.accepted_path) == step.accepted_len + 1


# ------------------------------------------------------------------------------ the baseline itself

def test_teacher_only_baseline_is_fp64_greedy(big):
    """Each baseline token is the fp64 reference's argmax (up to a near-tie of 1e-4 relative)."""
    for name in ("p1", "p9"):
        base = big.baseline(name)
        assert base.stop_reason == "max_new_tokens" and len(base.tokens) == NEW_TOKENS
        assert base.verify_steps == NEW_TOKENS - 1  # one N = 1 step per token after the prefill's
        seq = list(PROMPTS[name])
        logits = reference_forward(TINY, big.state, np.array(seq + base.tokens[:-1])).logits[len(seq) - 1:]
        chosen = logits[np.arange(NEW_TOKENS), base.tokens]
        gap = logits.max(axis=-1) - chosen
        assert np.all(gap <= 1e-4 * np.abs(logits).max()), f"{name}: not greedy at {np.flatnonzero(gap)}"
        assert len(set(base.tokens)) >= 8  # the tiny teacher is not degenerate


# ------------------------------------------------------------------------------ max_new_tokens, full matrix

# every (budget, depth) pair, each in one mode; every budget and every depth in both modes
SPECULATIVE_CASES = [(budget, depth, (i + j) % 2 == 1) for i, budget in enumerate((1, 4, 16, 64))
                     for j, depth in enumerate((1, 4, 10))]


@pytest.mark.parametrize("budget, max_depth, reference", SPECULATIVE_CASES,
                         ids=[f"{b}-{d}-{'reference' if r else 'performance'}" for b, d, r in SPECULATIVE_CASES])
def test_speculative_equals_teacher_only(big, budget, max_depth, reference):
    drafters = DRAFTERS if not reference else DRAFTERS[:2]
    accepted, copies = [], 0
    for name in PROMPTS:
        base = big.baseline(name)
        for drafter_cfg in drafters:
            res = speculate(big, name, budget, max_depth, reference, drafter_cfg)
            assert res.tokens == base.tokens, f"{name} drafter {drafter_cfg}: speculative output differs"
            assert res.stop_reason == "max_new_tokens"
            check_steps(res, budget, max_depth)
            accepted += res.accepted_lengths
            copies += sum(s.reorder_copy for s in res.steps)
    # the drafter really exercised the loop: long accepts, and out-of-order commits when possible
    assert max(accepted) == min(budget, max_depth)
    if budget >= 4 and max_depth >= 4:
        assert copies > 0


def test_stop_on_max_new_tokens_mid_accept(big):
    """max_new_tokens cuts a long accepted path: output == baseline prefix, nothing more."""
    for max_new in (1, 2, 3, 7):
        want = big.baseline("p9").tokens[:max_new]
        assert big.baseline("p9", max_new=max_new).tokens == want
        res = speculate(big, "p9", 16, 10, False, (1, 0.0, 1), max_new=max_new)
        assert res.tokens == want and res.stop_reason == "max_new_tokens"
        if max_new == 1:
            assert res.verify_steps == 0  # the prefill's token is already the whole answer


# ------------------------------------------------------------------------------ measured fallback bar

@pytest.mark.parametrize("seeded_s, always_drafts", [((1e3, 1e-3), False), ((1e-9, 1.0), True)],
                         ids=["drafting-hopeless", "drafting-free"])
def test_measured_fallback_bar_drives_the_loop(big, seeded_s, always_drafts):
    """``fallback_accept: auto`` with step costs seeded so that drafting looks hopeless (bar ~1e6) or free
    (bar 0). The loop's real step times move each average by 10 % per step, far too little to cross either
    bar in 40 tokens, so the steps are those of a fixed bar of inf (a probe every 3rd step) or of 0; the
    loop feeds every step's time to the costs; the output is the teacher-only one either way."""
    costs = StepCosts()
    costs.record(True, seeded_s[0])
    costs.record(False, seeded_s[1])
    settings = DecodeSettings(budget=16, max_depth=4, max_new_tokens=NEW_TOKENS, fallback_accept="auto",
                              fallback_steps=2, step_costs=costs)
    drafter = OracleDrafter(big.baseline("p9").tokens, TINY.vocab_size, 16, 4, error_rate=0.0, seed=1)
    res = generate(big.runner(4), PROMPTS["p9"], settings, drafter)
    assert res.tokens == big.baseline("p9").tokens
    drafted = [s.tree_nodes > 0 for s in res.steps]
    assert drafted == ([True] * len(drafted) if always_drafts else [j % 3 == 0 for j in range(len(drafted))])
    assert costs.counts == {"speculative": 1 + sum(drafted), "decode": 1 + len(drafted) - sum(drafted)}
    assert res.fallback_bar == (0.0 if always_drafts else pytest.approx(costs.break_even))


# ------------------------------------------------------------------------------ EOS

def eos_cases(base_tokens):
    """(eos token, expected output): the first token, and tokens first seen around the middle."""
    cases = [(base_tokens[0], base_tokens[:1])]
    for i in (5, 12, 20):
        tok = base_tokens[i]
        first = base_tokens.index(tok)
        if first > 0:
            cases.append((tok, base_tokens[:first + 1]))
    return cases


@pytest.mark.parametrize("reference", [False, True], ids=["performance", "reference"])
@pytest.mark.parametrize("budget, max_depth", [(4, 4), (16, 10), (64, 10), (1, 1)])
def test_stop_on_eos(big, budget, max_depth, reference):
    n_cases = 0
    for name in ("p9", "p17"):
        for eos, want in eos_cases(big.baseline(name).tokens):
            base = big.baseline(name, eos=eos)
            assert base.tokens == want and base.stop_reason == "eos"
            for drafter_cfg in DRAFTERS[:2]:
                res = speculate(big, name, budget, max_depth, reference, drafter_cfg, eos=eos)
                assert res.tokens == want, f"{name} eos={eos} drafter {drafter_cfg}"
                assert res.stop_reason == "eos"
            n_cases += 1
    assert n_cases >= 4


# ------------------------------------------------------------------------------ KV capacity

@pytest.mark.parametrize("budget, max_depth, reference", [(4, 4, False), (4, 10, True), (16, 10, False),
                                                       (16, 1, True), (64, 10, False), (64, 10, True)])
def test_stop_on_capacity(small, big, budget, max_depth, reference):
    """Capacity 40: teacher-only stops after capacity - P + 1 tokens; speculative stops at the same
    token, falling back to N = 1 steps once a full tree no longer fits."""
    for name in ("p9", "p17"):
        base = small.baseline(name, max_new=200)
        n_prompt = PROMPTS[name].size
        assert base.stop_reason == "capacity" and len(base.tokens) == SMALL_CAPACITY - n_prompt + 1
        assert base.tokens == big.baseline(name).tokens[:len(base.tokens)]  # capacity changes no logit
        for drafter_cfg in DRAFTERS[:3] if not reference else DRAFTERS[:1]:
            res = speculate(small, name, budget, max_depth, reference, drafter_cfg, max_new=200,
                            continuation=base.tokens)
            assert res.tokens == base.tokens, f"{name} drafter {drafter_cfg}"
            assert res.stop_reason == "capacity"
            check_steps(res, budget, max_depth)
            sizes = [s.tree_nodes for s in res.steps]
            if budget + 1 + n_prompt <= SMALL_CAPACITY:
                assert max(sizes) > 0 and sizes[-1] == 0  # trees early, N = 1 fallback at the end
            else:
                assert max(sizes) == 0  # a tree never fits: every step is the fallback
