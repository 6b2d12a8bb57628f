"""The shipped demo pair (eagle_ms/assets/demo, configs/demo.yaml): it loads, its greedy output agrees with
an independent NumPy fp64 forward and is identical with and without the draft, its seeded sampled output
too (T 0.7 and 1.0, top-p / top-k), and the shipped draft's acceptance on held-out ShareGPT prompts is far
above a random-weight draft's (computed here, same budget).

Held-out prompts: ShareGPT conversations with index i % 50 == 49 (held out from the teacher's training,
MODEL_CARD.md) at i >= 10000 (of 17 545), far past the conversations the draft was trained on (--limit in the card).
"""
import json
import os

import numpy as np
import pytest

from conftest import REPO
from eagle_ms.models.weight_tiles import unpack_tiles
from eagle_ms.assets import DEMO_DIR
from eagle_ms.config import SamplingParams, load_config
from eagle_ms.device_drafter import DeviceTreeDrafter
from eagle_ms.draft_weights import load_draft_checkpoint, random_draft_state
from eagle_ms.drafting import TreeParams
from eagle_ms.runtime import eagle3_drafter_from_state
from eagle_ms.session import Session
from numpy_reference import reference_forward

DEMO_YAML = os.path.join(REPO, "configs", "demo.yaml")
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def session():
    # every step drafts (fallback off): tau here measures the draft itself; the fallback's losslessness is
    # tested in test_eagle3_lossless.py / test_cli.py. The shipped step (fused) runs here, the two-call device
    # step with the random draft below, and the host step in the demo entry-point test.
    cfg = load_config(DEMO_YAML, {"speculative.draft": "eagle3", "generation.max_new_tokens": NEW_TOKENS,
                                  "runtime.seq_length": 1024, "runtime.attention_windows": None,
                                  "speculative.fallback_accept": 0.0})
    assert cfg.speculative.step == "fused"
    s = Session(cfg)
    s.warm_up()
    return s


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Independent reader (header length u64 LE, JSON header, raw little-endian data), fp16/fp32 only."""
    with open(path, "rb") as fh:
        raw = fh.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    dtypes = {"F16": np.float16, "F32": np.float32}
    out = {}
    for key, meta in header.items():
        if key != "__metadata__":
            start, end = meta["data_offsets"]
            data = np.frombuffer(raw[8 + n + start:8 + n + end], dtype=dtypes[meta["dtype"]])
            out[key] = data.reshape(meta["shape"]).astype(np.float64)
    return out


def _chat(session, text: str) -> np.ndarray:
    ids = session.template.encode_chat(session.tokenizer, [{"role": "user", "content": text}], True).ids
    return np.asarray(ids, dtype=np.int32)


def _heldout_prompts(count: int, max_tokens: int = 200) -> list[str]:
    from eagle_ms.train.data import load_sharegpt

    convs = load_sharegpt(limit=10000 + 50 * (count + 40)).conversations
    prompts = []
    for i in range(10000 + 49, len(convs), 50):
        first = convs[i].messages[0]
        if first["role"] == "user" and 20 <= len(first["content"]) <= 4 * max_tokens:
            prompts.append(first["content"])
        if len(prompts) == count:
            return prompts
    raise AssertionError(f"only {len(prompts)} held-out prompts found")


def test_config_points_at_shipped_assets():
    cfg = load_config(DEMO_YAML)
    assert os.path.samefile(cfg.checkpoint, os.path.join(DEMO_DIR, "teacher"))
    assert os.path.samefile(cfg.speculative.draft_path, os.path.join(DEMO_DIR, "draft"))
    with open(os.path.join(DEMO_DIR, "teacher", "config.json")) as fh:
        assert json.load(fh)["num_hidden_layers"] == cfg.model.num_hidden_layers
    load_draft_checkpoint(cfg.speculative.draft_path, cfg.model)  # raises on any mismatch


def test_teacher_greedy_matches_numpy_reference(session):
    """First greedy tokens of the compiled teacher == argmax of the fp64 reference on the shipped weights."""
    cfg = session.cfg.model
    state = _read_safetensors(os.path.join(session.cfg.checkpoint, "model.safetensors"))
    ids = _chat(session, "Explain in two sentences why the sky is blue.")
    tokens = session.run(ids).tokens[:8]
    seq = list(ids)
    for t in tokens:
        logits = reference_forward(cfg, state, seq).logits[-1]
        top2 = np.sort(logits)[-2:]
        if top2[1] - top2[0] > 1e-3:  # an fp32-vs-fp64 near-tie is not a disagreement
            assert int(np.argmax(logits)) == t
        seq.append(t)


def test_fixed_prompt_identical_with_and_without_draft(session):
    ids = _chat(session, "Write a Python function that returns the n-th Fibonacci number.")
    base = session.run(ids)
    ea = session.run(ids, session.make_drafter(ids))
    assert ea.tokens == base.tokens and len(base.tokens) == NEW_TOKENS
    assert len(session.tokenizer.decode(base.tokens).split()) >= 5  # real words, not byte noise


SAMPLED = [(SamplingParams(0.7, 50, 1.0, 1), "Write a Python function that returns the n-th Fibonacci number."),
           (SamplingParams(1.0, 0, 0.9, 2), "Give three tips for staying healthy.")]


def test_seeded_sampling_identical_with_and_without_draft(session):
    """Position-keyed sampling: the speculative run reproduces the teacher-only run of the same seed, and
    draft tokens are accepted at T > 0 (the demo teacher is flat, perplexity ~120: tau is lower than greedy).
    One prompt per setting (T 0.7 with top-k; T 1.0 with top-p)."""
    accepted = []
    for params, text in SAMPLED:
        ids = _chat(session, text)
        base = session.run(ids, sampling=params)
        ea = session.run(ids, session.make_drafter(ids), sampling=params)
        assert ea.tokens == base.tokens, (params, text)
        assert base.tokens != _greedy(session, text)  # sampled, not the greedy answer
        accepted += ea.accepted_lengths
    assert max(accepted) >= 1, accepted  # T = 1: mostly A = 0, the teacher is flat (docs/architecture.md)


_GREEDY: dict[str, list[int]] = {}


def _greedy(session, text: str) -> list[int]:
    if text not in _GREEDY:
        _GREEDY[text] = session.run(_chat(session, text)).tokens
    return _GREEDY[text]


def test_shallow_trees_on_the_shipped_pair(session):
    """speculative.shallow_depth 3 on the shipped pair and fused step: identical to teacher-only, and each
    step's tree is the one the policy picks from the previous step's accepted count (hand rule: shallow
    after A < 3, k + 2k^2 = 2 + 2 * 2^2 = 10 nodes; the full budget (12) first and after A >= 3); both kinds
    occur."""
    spec = session.cfg.speculative
    assert (spec.top_k, spec.budget) == (2, 12)  # the shipped tree the hand rule above is worked out for
    shallow = TreeParams(spec.budget, spec.max_depth, spec.top_k).shallow(3)
    kinds = set()
    for text in ("Write a Python function that returns the n-th Fibonacci number.",
                 "Give three tips for staying healthy."):
        ids = _chat(session, text)
        ea = session.run(ids, session.make_drafter(ids), shallow=shallow)
        assert ea.tokens == _greedy(session, text)
        nodes = [s.tree_nodes for s in ea.steps]
        assert nodes == [spec.budget] + [10 if a < 3 else spec.budget for a in ea.accepted_lengths[:-1]]
        kinds |= set(nodes)
    assert kinds == {10, spec.budget}


def test_shipped_draft_kernels_read_float16_copies(session):
    """The shipped draft is stored in float16, so its layer kernels read float16 copies of its matrices (the
    same values as the float32 Parameters), and the score temperature T sits in the final norm's weight
    (stored / T), not in the lm_head; a draft state with values float16 does not hold gets float32 kernels."""
    spec = session.cfg.speculative
    draft = session.eagle3.draft
    _, stored = load_draft_checkpoint(spec.draft_path, session.cfg.model)
    assert draft.half_matrices is not None and spec.score_temperature != 1.0
    for half, full in zip(draft.half_matrices.matrices(), draft.float_matrices()):
        np.testing.assert_array_equal(unpack_tiles(half.asnumpy()).astype(np.float32), full.asnumpy())
    np.testing.assert_array_equal(draft.lm_head.weight.asnumpy(), stored["lm_head.weight"].T)
    np.testing.assert_array_equal(draft.norm.weight.asnumpy(), (stored["norm.weight"].astype(np.float64)
                                                                 / spec.score_temperature).astype(np.float32))
    random_state = random_draft_state(draft.config, seed=1)
    random_state["d2t"], random_state["t2d"] = stored["d2t"], stored["t2d"]
    plain = eagle3_drafter_from_state(session.runner, draft.config, random_state, 4, 2, 2)
    assert plain.draft.half_matrices is None


def test_shipped_draft_acceptance_far_above_random_draft(session):
    spec = session.cfg.speculative
    draft_cfg, shipped_state = load_draft_checkpoint(spec.draft_path, session.cfg.model)
    random_state = random_draft_state(draft_cfg, seed=1)
    random_state["d2t"], random_state["t2d"] = shipped_state["d2t"], shipped_state["t2d"]
    random_drafter = DeviceTreeDrafter(eagle3_drafter_from_state(session.runner, draft_cfg, random_state,
                                                                 spec.budget, spec.max_depth, spec.top_k))
    random_drafter.warm_up()
    taus = {"shipped": [], "random": []}
    for text in _heldout_prompts(2):
        ids = _chat(session, text)
        base = session.run(ids).tokens
        for name, drafter in (("shipped", session.make_drafter(ids)), ("random", random_drafter)):
            result = session.run(ids, drafter)
            assert result.tokens == base
            taus[name].append(result.tau)
    shipped, rand = np.mean(taus["shipped"]), np.mean(taus["random"])
    print(f"held-out tau: shipped {shipped:.2f} {taus['shipped']}, random {rand:.2f} {taus['random']}")
    assert rand < 1.5 and shipped > rand + 1.0, taus


def test_demo_entry_point_on_the_bundled_sample(capsys):
    """`bash scripts/demo.sh` minus set-up: the bundled sample, short answers, exit 0 (all identical). One
    attention window of 1 024 slots (the session fixture's cache) instead of the shipped four: a quarter of
    the graphs to compile; the shipped windows' output is the same (tests/test_attention_window.py). It runs
    the host step, the reference (the fixture runs the shipped fused step), so every step meets this pair."""
    from eagle_ms.demo import SAMPLE_DATA, main

    small_cache = ["--set", "runtime.seq_length=1024", "--set", "runtime.attention_windows=null"]
    host = ["--set", "speculative.step=host"]
    assert main(["--data-dir", SAMPLE_DATA, "--per-dataset", "1", "--max-new-tokens", "12", *small_cache, *host]) == 0
    out = capsys.readouterr().out
    assert out.count("output identical") == 2 and "### mt_bench 81" in out and "### humaneval 0" in out
    assert "outputs all identical to teacher-only" in out
    with pytest.raises(ValueError, match="config key 'generation.top_p' = 1.5"):  # the sampling flags reach the config
        main(["--data-dir", SAMPLE_DATA, "--temperature", "0.8", "--top-p", "1.5", "--seed", "4"])
