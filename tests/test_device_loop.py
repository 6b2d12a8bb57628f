"""The device step in the one loop (eagle_ms/device_step.py): speculative == teacher-only greedy, token for token.

A tiny teacher and random EAGLE-3 drafts drive ``generate(..., verifier=DeviceVerifier)`` with the
draft on the device (DeviceTreeDrafter), in performance and reference mode (device tree == host path
tree, invariants, device acceptance == greedy_accept, commit equivalence at every step), with the
low-acceptance fallback (pending pairs observed on the host), near the cache's end (capacity stop), and
with the test drafter's host trees through the device verify graph; and the same with draft and verify
fused into one graph call per step (eagle_ms/device_fused.py). At T > 0 the graphs sample in the
graph (eagle_ms/models/sampler.py) and the seeded device runs must equal seeded host-loop teacher-only
sampling. The baseline is the host-driven loop without a drafter (a second implementation of the same
decode, with the host sampler eagle_ms/sampling.py).
"""
import numpy as np
import pytest

from eagle_ms.config import GREEDY, SamplingParams
from eagle_ms.device_drafter import DeviceTreeDrafter, no_step_inputs
from eagle_ms.device_fused import FusedTreeSteps
from eagle_ms.device_verify import DeviceVerifier
from eagle_ms.draft_weights import default_draft_config, load_draft_state, random_draft_state
from eagle_ms.drafting import TreeParams
from eagle_ms.eagle3_drafter import Eagle3Drafter, scratch_size
from eagle_ms.generate import DecodeSettings, generate
from eagle_ms.host_step import CommitMismatch, check_commit
from eagle_ms.models.eagle3 import Eagle3Draft, Eagle3Expand
from eagle_ms.oracle_drafter import OracleDrafter
from helpers_models import TINY, build_teacher, make_runner, prompt

CAPACITY = 64
CHUNK = 8
DEPTH = 4
NEW_TOKENS = 24
PROMPTS = [prompt(11, 3), prompt(12, 13)]


class World:
    def __init__(self):
        self.model, _ = build_teacher(CAPACITY, seed=41)
        self.runner = make_runner(self.model, CHUNK, DEPTH)
        self.cfg = default_draft_config(TINY, draft_vocab_size=40)
        params = TreeParams(8, DEPTH, 2)
        self.draft = Eagle3Draft(self.cfg, 1, CAPACITY + scratch_size(params, CHUNK), 2,
                                 embed=self.model.model.embed_tokens.weight)
        self.expand = Eagle3Expand(self.draft)
        self.verifiers = {ref: DeviceVerifier(self.runner, DEPTH, reference=ref) for ref in (False, True)}
        self.device_drafters = {}
        self.fused_steps = {}

    def drafter(self, budget, seed, reference=False, fused=False):
        """``device_drafter(budget, seed)``, or the fused draft+verify graphs over it and the verifier of
        ``reference`` (one FusedTreeSteps per (budget, reference), so each compiles once)."""
        device = self.device_drafter(budget, seed)
        if not fused:
            return device
        if (budget, reference) not in self.fused_steps:
            self.fused_steps[budget, reference] = FusedTreeSteps(device, self.verifiers[reference])
        return self.fused_steps[budget, reference]

    def baseline(self, i, n=NEW_TOKENS):
        return generate(self.runner, PROMPTS[i], DecodeSettings(max_depth=DEPTH, max_new_tokens=n)).tokens

    def device_drafter(self, budget, seed):
        """New random draft weights (in place: the compiled graphs read the Parameters) for one drafter per
        budget (one compiled DraftTreeStep each)."""
        load_draft_state(self.draft, random_draft_state(self.cfg, seed, std=0.3))
        if budget not in self.device_drafters:
            host = Eagle3Drafter(self.draft, TreeParams(budget, DEPTH, 2), CAPACITY, CHUNK, expand_cell=self.expand)
            self.device_drafters[budget] = DeviceTreeDrafter(host)
        return self.device_drafters[budget]


@pytest.fixture(scope="module")
def world():
    return World()


@pytest.mark.parametrize("budget, reference, fused", [(1, False, False), (1, True, False), (8, False, False),
                                                      (8, True, False), (8, False, True), (8, True, True)])
def test_device_step_equals_teacher_only(world, budget, reference, fused):
    """Two graph calls per step, or one fused call (``FusedTreeSteps``; budget 8 only: each (budget, mode)
    is one more compiled fused graph): the same tokens as teacher-only."""
    for i in range(len(PROMPTS)):
        settings = DecodeSettings(budget=budget, max_depth=DEPTH, max_new_tokens=NEW_TOKENS,
                                  reference_checks=reference)
        res = generate(world.runner, PROMPTS[i], settings, world.drafter(budget, 7 + i, reference, fused),
                       world.verifiers[reference])
        assert res.tokens == world.baseline(i), f"prompt {i}"
        assert all(s.tree_nodes <= budget for s in res.steps)
        drafted = [s.stage_s for s in res.steps if s.tree_nodes > 0]
        assert drafted and all(("draft_verify" in st) == fused and ("verify" in st) != fused for st in drafted)


@pytest.mark.parametrize("fused", [False, True])
def test_device_step_with_fallback_observes_pending_pairs(world, fused):
    """A bar no draft reaches: fallback periods of 2 teacher-only steps, then a probe from pairs observed
    on the host (the draft cache must stay complete, or the probes would draft from a stale context)."""
    settings = DecodeSettings(budget=8, max_depth=DEPTH, max_new_tokens=NEW_TOKENS, reference_checks=True,
                              fallback_accept=DEPTH + 1, fallback_steps=2)
    res = generate(world.runner, PROMPTS[1], settings, world.drafter(8, 3, True, fused), world.verifiers[True])
    assert res.tokens == world.baseline(1)
    drafted = [s.tree_nodes > 0 for s in res.steps]
    assert any(drafted) and not all(drafted)


@pytest.mark.parametrize("fused", [False, True])
def test_device_step_stops_at_capacity_like_teacher_only(world, fused):
    long_prompt = prompt(13, CAPACITY - 12)
    settings = DecodeSettings(budget=8, max_depth=DEPTH, max_new_tokens=200)
    res = generate(world.runner, long_prompt, settings, world.drafter(8, 5, False, fused), world.verifiers[False])
    base = generate(world.runner, long_prompt, DecodeSettings(max_depth=DEPTH, max_new_tokens=200))
    assert res.stop_reason == base.stop_reason == "capacity"
    assert res.tokens == base.tokens


def test_host_trees_through_the_device_verify_graph(world):
    base = world.baseline(0)
    drafter = OracleDrafter(base, TINY.vocab_size, 8, DEPTH, seed=2)
    settings = DecodeSettings(budget=8, max_depth=DEPTH, max_new_tokens=NEW_TOKENS, reference_checks=True)
    res = generate(world.runner, PROMPTS[0], settings, drafter, world.verifiers[True])
    assert res.tokens == base
    assert np.mean([s.accepted_len for s in res.steps]) > 0  # the oracle's trees are accepted


def test_teacher_only_through_the_device_graph_hands_the_host_only_tokens(world):
    res = generate(world.runner, PROMPTS[0], DecodeSettings(max_depth=DEPTH, max_new_tokens=NEW_TOKENS),
                   None, world.verifiers[False])
    assert res.tokens == world.baseline(0)
    step = world.verifiers[False].decode(int(res.tokens[-1])) if world.runner.length + 1 <= CAPACITY else None
    if step is not None:  # what a performance-mode step returns: ints on the host, no vocabulary axis
        assert step.argmax is None and step.tokens.dtype.kind == "i" and step.tokens.ndim == 1


SHALLOW = TreeParams(8, DEPTH, 2).shallow(2)  # speculative.shallow_depth 2: 2 + 4 = 6 nodes, depth <= 2


def test_no_graph_compiles_after_warm_up(world):
    """After ``warm_up`` of the draft graphs (every window; full and shallow trees), the decode graphs and the
    verify graphs (M + 1 and the shallow tree's 7 rows), whole generations with new prompts and new draft
    weights, with and without shallow trees, compile nothing: every compile cache keeps its size."""
    drafter, verifier = world.device_drafter(8, 21), world.verifiers[False]
    drafter.warm_up()
    drafter.warm_up(params=SHALLOW)
    verifier.warm_up([1, 9, SHALLOW.budget + 1])

    def cache_sizes():
        return ({w: len(c.compile_cache) for w, c in drafter.steps.items()},
                {w: len(c.compile_cache) for w, c in verifier.steps.items()},
                {w: len(c.compile_cache) for w, c in verifier.decode_steps.items()})

    warm = cache_sizes()
    assert set(warm[0]) == {(w, p) for w in drafter.drafter.attention_windows for p in (drafter.params, SHALLOW)}
    for i, seed, shallow in ((0, 22, None), (1, 23, SHALLOW), (0, 24, SHALLOW)):
        settings = DecodeSettings(budget=8, max_depth=DEPTH, max_new_tokens=NEW_TOKENS, shallow=shallow)
        res = generate(world.runner, PROMPTS[i], settings, world.device_drafter(8, seed), verifier)
        assert res.tokens == world.baseline(i)
        assert (6 in {s.tree_nodes for s in res.steps}) == (shallow is not None)
    assert cache_sizes() == warm


def test_fused_step_compiles_nothing_after_warm_up_and_hands_the_host_only_tokens(world):
    """``FusedTreeSteps.warm_up`` compiles one fused graph per window a tree fits; generations then compile
    nothing (neither a fused graph nor the draft or verify graph called alone). A
    performance-mode call returns only the packed result and the aux rows, no tree, no vocabulary axis."""
    fused, verifier = world.drafter(8, 25, False, True), world.verifiers[False]
    fused.warm_up()
    fused.warm_up(SHALLOW)
    verifier.warm_up([1])
    nodes = 9

    def cache_sizes():  # the fused graphs, the decode graphs, and the two halves called alone
        return ({w: len(c.compile_cache) for w, c in fused.graphs.items()},
                {w: len(c.compile_cache) for w, c in verifier.decode_steps.items()},
                {w: (len(c.draft_step.compile_cache), len(c.verify_step.compile_cache))
                 for w, c in fused.graphs.items()})

    warm = cache_sizes()
    full = fused.device_tree.params
    assert {w for w, p in warm[0] if p == full} == {w for w in world.runner.attention_windows if w >= nodes + 1}
    assert {w for w, p in warm[0] if p == SHALLOW} == {w for w in world.runner.attention_windows
                                                      if w >= SHALLOW.budget + 2}
    assert all(n == 1 for n in warm[0].values())
    for i, seed in ((0, 26), (1, 27)):
        settings = DecodeSettings(budget=8, max_depth=DEPTH, max_new_tokens=NEW_TOKENS, shallow=SHALLOW if i else None)
        res = generate(world.runner, PROMPTS[i], settings, world.drafter(8, seed, False, True), verifier)
        assert res.tokens == world.baseline(i)
    assert cache_sizes() == warm

    world.runner.prefill(PROMPTS[0])
    outputs, tree = fused.call(*_no_step(), world.runner.length, -1)
    assert tree is None and len(outputs) == 2
    assert [tuple(o.shape) for o in outputs] == [(1, 2 * DEPTH + 3), (1, DEPTH + 1, 3 * TINY.hidden_size)]
    world.runner.reset()


def test_fused_refuses_a_wrong_draft_length_and_reference_checks_without_tree_outputs(world):
    fused = world.drafter(8, 28, False, True)
    world.runner.prefill(PROMPTS[1])
    length = world.runner.length
    with pytest.raises(ValueError, match=f"draft would be at {length + 3} committed pairs .* holds {length}"):
        fused.call(*_no_step(), length, 2)
    with pytest.raises(ValueError, match="accepted=9"):
        fused.call(*_no_step(), length, 9)
    world.runner.reset()
    checked = DecodeSettings(budget=8, max_depth=DEPTH, max_new_tokens=4, reference_checks=True)
    with pytest.raises(ValueError, match="reference=True"):  # performance graphs do not output the tree
        generate(world.runner, PROMPTS[1], checked, fused, world.verifiers[False])


def _no_step():
    return no_step_inputs(DEPTH, 3 * TINY.hidden_size)


@pytest.mark.parametrize("params, reference", [(SamplingParams(0.5, 20, 1.0, 3), True),
                                               (SamplingParams(1.5, 0, 0.9, 4), False)])
def test_seeded_device_sampling_equals_seeded_teacher_only(world, params, reference):
    """T > 0 through the device graphs (the verify and decode graphs sample in the graph): the device
    drafter's trees, the oracle's host trees around the sampled answer, and device teacher-only decoding
    each reproduce host-loop teacher-only sampling of the same seed. Reference mode also checks every
    emitted token against the host sampler on a sequential re-decode."""
    verifier = DeviceVerifier(world.runner, DEPTH, reference=reference, sampling=params)
    fused_steps = None
    for i in range(len(PROMPTS)):
        def settings(budget=0):
            return DecodeSettings(budget=budget, max_depth=DEPTH, max_new_tokens=NEW_TOKENS, sampling=params,
                                  reference_checks=reference)
        base = generate(world.runner, PROMPTS[i], settings()).tokens  # host loop, host sampler
        assert base != world.baseline(i)  # sampled, not greedy
        device = generate(world.runner, PROMPTS[i], settings(8), world.device_drafter(8, 30 + i), verifier)
        assert device.tokens == base, f"device drafter, prompt {i}"
        if reference:  # the fused graph samples in its verify half too (one sampled fused graph compiled)
            fused_steps = fused_steps or FusedTreeSteps(world.device_drafter(8, 40), verifier)
            world.device_drafter(8, 40 + i)  # new draft weights, read by the compiled graph
            fused = generate(world.runner, PROMPTS[i], settings(8), fused_steps, verifier)
            assert fused.tokens == base, f"fused draft+verify, prompt {i}"
        oracle = OracleDrafter(base, TINY.vocab_size, 8, DEPTH, seed=i)
        host_trees = generate(world.runner, PROMPTS[i], settings(8), oracle, verifier)
        assert host_trees.tokens == base and max(host_trees.accepted_lengths) >= 1, f"host trees, prompt {i}"
        assert generate(world.runner, PROMPTS[i], settings(), None, verifier).tokens == base


def test_reference_check_names_a_wrong_choice(world):
    """check_commit re-decodes the committed tokens: a step whose emitted token is not the host argmax
    (greedy) or the host sampler's draw (T > 0) after them is reported, with the position."""
    runner = world.runner
    for params in (GREEDY, SamplingParams(1.0, 0, 1.0, 9)):
        verifier = world.verifiers[False] if params.greedy else DeviceVerifier(runner, DEPTH, sampling=params)
        root = int(runner.prefill(PROMPTS[0]).argmax[-1])
        start = runner.length
        step = verifier.decode(root)
        committed = np.array([root], np.int32)
        check_commit(runner, start, committed, step.tokens, params)
        wrong = (step.tokens + 1) % TINY.vocab_size
        name = "argmax" if params.greedy else "sampler"
        with pytest.raises(CommitMismatch, match=f"position {start + 1}, but the host {name}"):
            check_commit(runner, start, committed, wrong, params)
