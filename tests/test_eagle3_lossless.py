"""Losslessness with a real EAGLE-3 drafter: speculative greedy output == teacher-only greedy output.

Random-weight EAGLE-3 drafts (seeded; a reduced draft vocabulary, so d2t maps every draft token) drive the loop
for budgets M in {1, 4, 16}, depths Dmax in {1, 4, 10}, k in {1, 4}, several draft seeds and prompts,
with ``draft_window`` set, and in reference mode (tree invariants + commit equivalence every step).
Whatever the draft proposes, the tokens must equal the teacher-only run of the same loop. Then the CLI
end to end: ``eagle-ms generate --draft eagle3 --draft-path P --budget --max-depth --top-k``.
"""
import json

import pytest

from eagle_ms.draft_weights import default_draft_config, load_draft_state, random_draft_state, save_draft_checkpoint
from eagle_ms.drafting import TreeParams
from eagle_ms.eagle3_drafter import Eagle3Drafter, scratch_size
from eagle_ms.generate import DecodeSettings, generate
from eagle_ms.models.eagle3 import Eagle3Draft, Eagle3Expand
from helpers_models import TINY, build_teacher, make_runner, prompt

CAPACITY = 96
CHUNK = 8
NEW_TOKENS = 20
PROMPTS = [prompt(1, 1), prompt(2, 9), prompt(3, 17)]
BUDGETS, DEPTHS, KS = (1, 4, 16), (1, 4, 10), (1, 4)
DRAFT_CAPACITY = CAPACITY + max(scratch_size(TreeParams(1, d, k), CHUNK) for d in DEPTHS for k in KS)


class World:
    """One tiny teacher and ONE compiled draft (reduced vocabulary, in-graph top-4, serving k = 1 and 4)."""

    def __init__(self):
        self.model, _ = build_teacher(CAPACITY, seed=31)
        self.runners = {d: make_runner(self.model, CHUNK, d) for d in DEPTHS}
        self.cfg = default_draft_config(TINY, draft_vocab_size=40)
        self.draft = Eagle3Draft(self.cfg, 1, DRAFT_CAPACITY, max(KS), embed=self.model.model.embed_tokens.weight)
        self.expand = Eagle3Expand(self.draft)
        self.baselines = {}

    def baseline(self, i):
        if i not in self.baselines:
            self.baselines[i] = generate(self.runners[1], PROMPTS[i], DecodeSettings(max_new_tokens=NEW_TOKENS))
        return self.baselines[i]

    def drafter(self, budget, depth, k, seed, window=None, min_path_prob=0.0):
        load_draft_state(self.draft, random_draft_state(self.cfg, seed, std=0.3))
        return Eagle3Drafter(self.draft, TreeParams(budget, depth, k, min_path_prob), CAPACITY, CHUNK, window,
                             expand_cell=self.expand)

    def speculate(self, i, budget, depth, k, seed, window=None, reference=False, min_path_prob=0.0,
                  fallback=(0.0, 16), shallow_depth=None):
        shallow = None if shallow_depth is None else TreeParams(budget, depth, k, min_path_prob).shallow(shallow_depth)
        settings = DecodeSettings(budget=budget, max_depth=depth, max_new_tokens=NEW_TOKENS,
                                  reference_checks=reference, fallback_accept=fallback[0],
                                  fallback_steps=fallback[1], shallow=shallow)
        drafter = self.drafter(budget, depth, k, seed, window, min_path_prob)
        return generate(self.runners[depth], PROMPTS[i], settings, drafter)


@pytest.fixture(scope="module")
def world():
    return World()


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("budget", BUDGETS)
def test_eagle3_speculative_equals_teacher_only(world, budget, depth, k):
    for i in ((budget + depth + k) % 3, (budget + depth + k + 1) % 3):  # two of the three prompts
        seed = 1000 * budget + 100 * depth + 10 * k + i
        res = world.speculate(i, budget, depth, k, seed)
        assert res.tokens == world.baseline(i).tokens, f"prompt {i} draft seed {seed}"
        for step in res.steps:
            assert step.tree_nodes <= budget and step.tree_depth <= min(depth, step.tree_nodes)
            assert step.accepted_len <= step.tree_depth


@pytest.mark.parametrize("window", [1, 3, 8])
def test_eagle3_with_draft_window(world, window):
    for i in range(len(PROMPTS)):
        res = world.speculate(i, 16, 4, 4, seed=70 + window + i, window=window)
        assert res.tokens == world.baseline(i).tokens


@pytest.mark.parametrize("min_path_prob", [0.05, 0.3, 0.9])
def test_eagle3_with_depth_cut(world, min_path_prob):
    for i in range(len(PROMPTS)):
        res = world.speculate(i, 16, 10, 4, seed=80 + i, min_path_prob=min_path_prob, reference=True)
        assert res.tokens == world.baseline(i).tokens


@pytest.mark.parametrize("fallback", [(0.5, 1), (2.0, 3), (float("inf"), 2)])
def test_eagle3_with_low_acceptance_fallback(world, fallback):
    """Teacher-only fallback steps and the batched observe after them leave the output unchanged (reference
    mode: commit equivalence every step). With an unreachable bar every probe falls back again: drafted steps
    are exactly every (fallback_steps + 1)-th."""
    for i in range(len(PROMPTS)):
        res = world.speculate(i, 16, 4, 4, seed=110 + i, reference=True, fallback=fallback)
        assert res.tokens == world.baseline(i).tokens
        drafted = [s.tree_nodes > 0 for s in res.steps]
        if fallback[0] == float("inf"):
            assert drafted == [j % (fallback[1] + 1) == 0 for j in range(len(drafted))]
        assert any(drafted)


@pytest.mark.parametrize("shallow_depth", [1, 3])
def test_eagle3_with_shallow_trees(world, shallow_depth):
    """speculative.shallow_depth on the host path (reference mode): after a step that accepted fewer than
    Ds drafts the tree is ``TreeParams.shallow(Ds)`` (M 16, Dmax 10, k 4 -> depth <= Ds, budget
    min(16, 4 + (Ds-1) 16)); the first step's tree is the full one. Output unchanged."""
    budget_of = {1: 4, 3: 16}
    for i in range(len(PROMPTS)):
        res = world.speculate(i, 16, 10, 4, seed=130 + i, reference=True, shallow_depth=shallow_depth)
        assert res.tokens == world.baseline(i).tokens
        steps = res.steps
        for prev, step in zip(steps, steps[1:]):
            if prev.accepted_len < shallow_depth:
                assert step.tree_depth <= shallow_depth and step.tree_nodes <= budget_of[shallow_depth]
        assert any(prev.accepted_len < shallow_depth for prev in steps[:-1]), "no shallow step was taken"


@pytest.mark.parametrize("budget, depth, k, window", [(16, 10, 4, None), (4, 4, 1, 2)])
def test_eagle3_reference_mode(world, budget, depth, k, window):
    for i in (1, 2):
        res = world.speculate(i, budget, depth, k, seed=90 + i, window=window, reference=True)
        assert res.tokens == world.baseline(i).tokens


def test_many_seeds_accept_drafts(world):
    """Over many seeds some draft tokens are accepted (the accept/observe path with A > 0 is exercised)."""
    accepted = []
    for seed in range(6):
        res = world.speculate(seed % 3, 16, 10, 4, seed=500 + seed)
        assert res.tokens == world.baseline(seed % 3).tokens
        accepted += res.accepted_lengths
    assert max(accepted) >= 1


# ------------------------------------------------------------------------------ CLI end to end

CLI_CONFIG = """
model:
  model_config: {vocab_size: 64, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 3,
                 num_attention_heads: 4, num_key_value_heads: 2, eos_token_id: 2}
  checkpoint: null
tokenizer: {model_file: null}
runtime: {seq_length: 64, prefill_chunk: 8}
"""


def test_cli_generate_eagle3(tmp_path, capsys):
    """A small YAML (no tokenizer): teacher-only vs ``--draft eagle3`` through ``eagle_ms.cli.main``."""
    from eagle_ms.cli import main
    from eagle_ms.config import load_config

    (tmp_path / "tiny.yaml").write_text(CLI_CONFIG)
    teacher = load_config(str(tmp_path / "tiny.yaml")).model
    cfg = default_draft_config(teacher, draft_vocab_size=40)
    save_draft_checkpoint(random_draft_state(cfg, 4, std=0.3), cfg, str(tmp_path / "draft"))
    common = ["generate", "--config", str(tmp_path / "tiny.yaml"), "--prompt-ids", "5,6,7,8,9,10,11",
              "--max-new-tokens", "16", "--json", "--runtime-seed", "2", "--set", "generation.stop_on_eos=false", "--no-warmup"]

    def run(*extra):
        assert main(common + list(extra)) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    base = run()
    spec = run("--draft", "eagle3", "--draft-path", str(tmp_path / "draft"), "--budget", "8", "--max-depth", "4",
               "--top-k", "3")
    assert spec["draft"] == "eagle3" and spec["tokens"] == base["tokens"] and len(base["tokens"]) == 16
    assert spec["verify_steps"] == len(spec["accepted_lengths"]) >= 1
    # the tree's score temperature, on the device-resident (fused) step in reference mode: every step's device
    # tree == the host build_tree over the same tempered draft, invariants, commit equivalence; same tokens
    for temperature in ("0.3", "3"):
        tempered = run("--draft", "eagle3", "--draft-path", str(tmp_path / "draft"), "--budget", "8", "--max-depth",
                       "4", "--top-k", "3", "--score-temperature", temperature, "--step", "fused", "--mode", "reference")
        assert tempered["tokens"] == base["tokens"], temperature
    assert main(common + ["--draft", "eagle3", "--draft-path", str(tmp_path / "draft"), "--score-temperature", "0"]) == 2
    assert "speculative.score_temperature" in capsys.readouterr().err
    # a draft for another teacher is refused with a clear error (exit code 2)
    other = default_draft_config(teacher, vocab_size=96, draft_vocab_size=96)
    save_draft_checkpoint(random_draft_state(other, 0), other, str(tmp_path / "other"))
    assert main(common + ["--draft", "eagle3", "--draft-path", str(tmp_path / "other")]) == 2
    assert "target vocab_size: draft 96 != teacher 64" in capsys.readouterr().err
