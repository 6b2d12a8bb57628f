"""EAGLE-3 draft checkpoint format (eagle_ms.draft_weights): round trips, interop, and every bad case.

The files are also read back with the ``safetensors`` package's NumPy loader (the reference reader other
engines use) to show the bytes are standard. No MindSpore graph is compiled except one tiny draft.
"""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from mindspore import Tensor

from conftest import REPO
from eagle_ms.assets import DEMO_DIR
from eagle_ms.config import ModelConfig, load_config
from eagle_ms.draft_weights import (ARCHITECTURE, CheckpointError, check_draft_matches_teacher, check_draft_state,
                                    default_draft_config, draft_config_from_json, draft_config_to_json, draft_state,
                                    draft_to_target, expected_draft_keys, load_draft_checkpoint, load_draft_state,
                                    random_draft_state, save_draft_checkpoint, vocab_maps,
                                    with_score_temperature)
from eagle_ms.models.eagle3 import Eagle3Config, Eagle3Draft
from helpers_safetensors import relabel

TEACHER = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2)  # aux layers (2, 4, 5)
REDUCED = default_draft_config(TEACHER, draft_vocab_size=24, intermediate_size=48)
FULL = default_draft_config(TEACHER)


def saved(tmp_path, cfg=REDUCED, seed=0, dtype="float32", name="draft"):
    out = str(tmp_path / name)
    state = random_draft_state(cfg, seed)
    save_draft_checkpoint(state, cfg, out, dtype)
    return out, state


def rewrite(path, edit_tensors=None, edit_config=None):
    """Edit a saved checkpoint in place (through the reference safetensors writer)."""
    st = os.path.join(path, "model.safetensors")
    if edit_tensors:
        tensors = load_file(st)
        edit_tensors(tensors)
        save_file(tensors, st)
    if edit_config:
        with open(os.path.join(path, "config.json")) as fh:
            raw = json.load(fh)
        edit_config(raw)
        with open(os.path.join(path, "config.json"), "w") as fh:
            json.dump(raw, fh)


# ------------------------------------------------------------------------------ round trips and interop

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_round_trip(tmp_path, dtype):
    path, state = saved(tmp_path, dtype=dtype)
    cfg, loaded = load_draft_checkpoint(path, TEACHER)
    assert cfg == REDUCED
    assert set(loaded) == set(expected_draft_keys(REDUCED)) | {"d2t", "t2d"}
    for key, value in state.items():
        tol = 0 if dtype == "float32" or value.dtype.kind != "f" else 2.0 ** -8 * np.abs(value).max()
        np.testing.assert_allclose(loaded[key], value, rtol=0, atol=tol, err_msg=key)
    assert loaded["d2t"].dtype == np.int64 and loaded["t2d"].dtype == bool


def test_file_is_standard_safetensors_and_config_is_explicit(tmp_path):
    path, state = saved(tmp_path)
    tensors = load_file(os.path.join(path, "model.safetensors"))  # the reference reader
    assert set(tensors) == set(state)
    assert tensors["d2t"].dtype == np.int64 and tensors["t2d"].dtype == np.bool_
    assert not any("embed" in k for k in tensors)
    with open(os.path.join(path, "config.json")) as fh:
        raw = json.load(fh)
    assert raw["architectures"] == [ARCHITECTURE] and raw["num_hidden_layers"] == 1
    for key, want in (("hidden_size", 32), ("intermediate_size", 48), ("num_attention_heads", 4),
                      ("num_key_value_heads", 2), ("head_dim", 8), ("vocab_size", 64), ("draft_vocab_size", 24),
                      ("target_hidden_size", 32), ("rope_theta", 10000.0), ("rms_norm_eps", 1e-5)):
        assert raw[key] == want, key
    assert raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]


def test_foreign_checkpoint_written_by_the_reference_writer_loads(tmp_path):
    """A SpecForge-style export: torch-free safetensors, an embedding key left in, config without
    rope_theta / aux ids / target_hidden_size: defaults 10000, the teacher's aux ids, hidden_size."""
    state = random_draft_state(REDUCED, 3)
    path = tmp_path / "foreign"
    path.mkdir()
    save_file({**state, "embed_tokens.weight": np.zeros((64, 32), np.float32)}, str(path / "model.safetensors"))
    raw = {"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 48,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 64,
           "draft_vocab_size": 24, "rms_norm_eps": 1e-5}
    (path / "config.json").write_text(json.dumps(raw))
    cfg, loaded = load_draft_checkpoint(str(path), TEACHER)
    assert cfg.rope_theta == 10000.0 and cfg.aux_layer_ids == (2, 4, 5) and cfg.target_hidden_size == 32
    assert "embed_tokens.weight" not in loaded
    np.testing.assert_array_equal(loaded["lm_head.weight"], state["lm_head.weight"])


def test_identity_vocab_maps_may_be_absent(tmp_path):
    path, state = saved(tmp_path, cfg=FULL)
    assert "d2t" not in state
    assert "d2t" not in load_file(os.path.join(path, "model.safetensors"))  # dropped like EAGLE does
    _, loaded = load_draft_checkpoint(path, TEACHER)
    np.testing.assert_array_equal(loaded["d2t"], np.zeros(64))
    assert loaded["t2d"].all()


def test_vocab_maps_convert_consistently():
    d2t, t2d = vocab_maps([7, 2, 5], 8)
    assert d2t.tolist() == [2, 4, 5] and np.flatnonzero(t2d).tolist() == [2, 5, 7]
    rng = np.random.default_rng(0)
    for _ in range(20):
        v = int(rng.integers(2, 200))
        used = rng.choice(v, int(rng.integers(1, v + 1)), replace=False)
        d2t, t2d = vocab_maps(used, v)
        targets = draft_to_target(d2t)
        assert np.array_equal(targets, np.sort(used))  # draft id -> target id, ascending
        assert np.array_equal(np.flatnonzero(t2d), targets)  # t2d marks exactly those
        assert np.array_equal(np.cumsum(t2d)[targets] - 1, np.arange(used.size))  # target -> draft id
    for bad in ([1, 1], [-1], [8], []):
        with pytest.raises(ValueError, match="used_tokens"):
            vocab_maps(bad, 8)


def test_cell_round_trip(tmp_path):
    path, state = saved(tmp_path)
    cfg, loaded = load_draft_checkpoint(path, TEACHER)
    draft = Eagle3Draft(cfg, 1, 16, 2)
    embed = np.ones((64, 32), np.float32)
    load_draft_state(draft, loaded, embed=embed)
    back = draft_state(draft)
    for key in state:
        np.testing.assert_array_equal(back[key], state[key], err_msg=key)
    np.testing.assert_array_equal(draft.d2t.asnumpy(), state["d2t"])
    np.testing.assert_array_equal(draft.embed_tokens.weight.asnumpy(), embed)
    assert not draft.embed_tokens.weight.requires_grad
    save_draft_checkpoint(back, cfg, str(tmp_path / "again"))
    _, again = load_draft_checkpoint(str(tmp_path / "again"), TEACHER)
    for key in state:
        np.testing.assert_array_equal(again[key], state[key], err_msg=key)
    with pytest.raises(ValueError, match="owns its embedding"):
        load_draft_state(draft, loaded)


@pytest.mark.parametrize("temperature", [0.3, 2.5])
def test_score_temperature_gives_log_softmax_of_logits_over_t(temperature):
    """The tempered draft's log-probs == a float64 log-softmax of the untempered draft's log-probs / T (a
    log-softmax is unchanged by a shift of its input, so log-probs stand in for the logits); each row's
    top-k ids are unchanged; the input state is left as it was; T = 1 is the state itself."""
    state = random_draft_state(REDUCED, 5, std=0.3)
    before = {k: v.copy() for k, v in state.items()}
    tempered = with_score_temperature(state, temperature)
    for key in state:
        np.testing.assert_array_equal(state[key], before[key], err_msg=key)
    assert with_score_temperature(state, 1.0) is state
    draft = Eagle3Draft(REDUCED, 1, 16, 2)
    embed = np.ones((64, 32), np.float32)
    hidden = Tensor(np.random.default_rng(3).normal(size=(1, 5, 32)).astype(np.float32))
    load_draft_state(draft, state, embed=embed)
    plain = draft.logprobs(hidden).asnumpy().astype(np.float64)[0]  # [5, Vd]
    load_draft_state(draft, tempered, embed=embed)
    got = draft.logprobs(hidden).asnumpy()[0]
    z = plain / temperature
    want = z - z.max(-1, keepdims=True) - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert np.abs(got - plain).max() > 0.1  # the knob changes the scores
    np.testing.assert_array_equal(np.argsort(-got, -1, kind="stable")[:, :2], np.argsort(-plain, -1, kind="stable")[:, :2])


def test_random_draft_state_is_seeded():
    a, b, c = (random_draft_state(REDUCED, s) for s in (1, 1, 2))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["fc.weight"], c["fc.weight"])
    check_draft_state(a, REDUCED)


# ------------------------------------------------------------------------------ bad checkpoints

def _drop(key):
    return lambda t: t.pop(key)


def _reshape(key, shape):
    def edit(t):
        t[key] = np.zeros(shape, np.float32)
    return edit


def _set(key, value):
    def edit(t):
        t[key] = value
    return edit


def _d2t_duplicate(t):
    t["d2t"] = t["d2t"].copy()
    t["d2t"][1] = t["d2t"][0] - 1  # draft ids 0 and 1 -> the same target id


def _t2d_flip(t):
    t2d = t["t2d"].copy()
    first, off = int(np.flatnonzero(t2d)[0]), int(np.flatnonzero(~t2d)[0])
    t2d[first], t2d[off] = False, True
    t["t2d"] = t2d


BAD_TENSORS = {
    "missing fc": (_drop("fc.weight"), "missing 1 key.*'fc.weight'"),
    "missing midlayer norm": (_drop("midlayer.hidden_norm.weight"), "midlayer.hidden_norm.weight"),
    "unexpected key": (_set("midlayer.self_attn.q_proj.bias", np.zeros(32, np.float32)), "unexpected.*q_proj.bias"),
    "fc shape": (_reshape("fc.weight", (32, 32)), r"'fc.weight': shape \(32, 32\).*expected \(32, 96\)"),
    "q_proj shape": (_reshape("midlayer.self_attn.q_proj.weight", (32, 32)), "q_proj.weight': shape"),
    "lm_head rows": (_reshape("lm_head.weight", (25, 32)), r"lm_head.weight': shape \(25, 32\)"),
    "int weight": (_set("norm.weight", np.ones(32, np.int32)), "norm.weight': dtype int32 is not a float"),
    "d2t out of range": (_set("d2t", np.full(24, 100, np.int64)), "outside \\[0, vocab_size=64\\)"),
    "d2t duplicate": (_d2t_duplicate, "same target id"),
    "d2t vs t2d": (_t2d_flip, "d2t inconsistent with t2d"),
    "t2d count": (_set("t2d", np.ones(64, bool)), "t2d' marks 64 target ids.*inconsistent"),
    "d2t shape": (_set("d2t", np.zeros(23, np.int64)), r"'d2t' has shape \(23,\)"),
    "t2d shape": (_set("t2d", np.zeros(63, bool)), r"'t2d' has shape \(63,\)"),
    "d2t float": (_set("d2t", np.zeros(24, np.float32)), "'d2t' must hold integers"),
    "d2t only": (_drop("t2d"), "has 'd2t' but not 't2d'"),
    "no maps, reduced vocab": (lambda t: (t.pop("d2t"), t.pop("t2d")), "no 'd2t'/'t2d' but draft_vocab_size 24"),
}


@pytest.mark.parametrize("case", sorted(BAD_TENSORS))
def test_bad_tensors_raise_naming_the_problem(tmp_path, case):
    edit, match = BAD_TENSORS[case]
    path, _ = saved(tmp_path)
    rewrite(path, edit_tensors=edit)
    with pytest.raises(CheckpointError, match=match):
        load_draft_checkpoint(path, TEACHER)


BAD_CONFIGS = {
    "teacher vocab": (lambda c: c.update(vocab_size=80), "target vocab_size: draft 80 != teacher 64"),
    "teacher hidden": (lambda c: c.update(target_hidden_size=48),
                       "target_hidden_size: draft 48 != teacher hidden_size 32"),
    "aux ids": (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[2, 4, 6]),
                r"aux layer ids: draft \[2, 4, 6\] != teacher \[2, 4, 5\]"),
    "no hidden_size": (lambda c: c.pop("hidden_size"), "config.json has no 'hidden_size'"),
    "bias": (lambda c: c.update(bias=True), "biases are not supported"),
    "bad heads": (lambda c: c.update(num_key_value_heads=3), "num_key_value_heads"),
    "draft vocab > vocab": (lambda c: c.update(draft_vocab_size=65), "draft_vocab_size"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_configs_raise_saying_which(tmp_path, case):
    edit, match = BAD_CONFIGS[case]
    path, _ = saved(tmp_path)
    rewrite(path, edit_config=edit)
    with pytest.raises(CheckpointError, match=match):
        load_draft_checkpoint(path, TEACHER)


def test_files_missing_or_corrupt(tmp_path):
    with pytest.raises(CheckpointError, match="draft checkpoint not found"):
        load_draft_checkpoint(str(tmp_path / "nowhere"), TEACHER)
    path, _ = saved(tmp_path)
    os.remove(os.path.join(path, "config.json"))
    with pytest.raises(CheckpointError, match="no config.json"):
        load_draft_checkpoint(path, TEACHER)
    path, _ = saved(tmp_path, name="b")
    with open(os.path.join(path, "config.json"), "w") as fh:
        fh.write("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_draft_checkpoint(path, TEACHER)
    path, _ = saved(tmp_path, name="c")
    st = os.path.join(path, "model.safetensors")
    with open(st, "r+b") as fh:
        fh.truncate(os.path.getsize(st) - 100)
    with pytest.raises(CheckpointError, match="truncated"):
        load_draft_checkpoint(path, TEACHER)


@pytest.mark.parametrize("text", ["[1, 2]", "3", '"hidden_size"', "null"])
def test_config_json_that_is_not_an_object_is_refused_naming_the_file(tmp_path, text):
    path, _ = saved(tmp_path)
    with open(os.path.join(path, "config.json"), "w") as fh:
        fh.write(text)
    with pytest.raises(CheckpointError, match="not a JSON object") as err:
        load_draft_checkpoint(path, TEACHER)
    assert os.path.join(path, "config.json") in str(err.value)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump({**draft_config_to_json(REDUCED), "eagle_config": [2, 4, 5]}, fh)
    with pytest.raises(CheckpointError, match="'eagle_config' must be a JSON object"):
        load_draft_checkpoint(path, TEACHER)


def test_teacher_check_lists_every_difference():
    other = ModelConfig(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=12,
                        num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(CheckpointError) as err:
        check_draft_matches_teacher(REDUCED, other)
    for part in ("vocab_size", "target_hidden_size", "hidden_size: draft 32 != teacher 48", "aux layer ids"):
        assert part in str(err.value)


def test_save_refuses_a_bad_state(tmp_path):
    state = random_draft_state(REDUCED, 0)
    state.pop("norm.weight")
    with pytest.raises(CheckpointError, match="norm.weight"):
        save_draft_checkpoint(state, REDUCED, str(tmp_path / "x"))
    assert not os.path.exists(tmp_path / "x" / "model.safetensors")


def test_config_json_round_trip_without_teacher():
    cfg = Eagle3Config(hidden_size=48, intermediate_size=40, num_attention_heads=2, num_key_value_heads=1,
                       head_dim=16, vocab_size=100, draft_vocab_size=30, target_hidden_size=64,
                       aux_layer_ids=(1, 3, 7), rope_theta=1e6, rms_norm_eps=1e-6)
    assert draft_config_from_json(draft_config_to_json(cfg), "<x>") == cfg
    raw = draft_config_to_json(cfg)
    raw.pop("eagle_config")
    with pytest.raises(CheckpointError, match="eagle_aux_hidden_state_layer_ids"):
        draft_config_from_json(raw, "<x>")


# ------------------------------------------------------------------------------ values and vocab-map positions

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_refused_naming_file_and_tensor(tmp_path, dtype, bad):
    path, state = saved(tmp_path, dtype=dtype)
    st = os.path.join(path, "model.safetensors")
    weights = load_file(st)
    weights["midlayer.mlp.up_proj.weight"][7, 1] = bad
    save_file(weights, st)
    with pytest.raises(CheckpointError) as err:
        load_draft_checkpoint(path, TEACHER)
    assert st in str(err.value) and "'midlayer.mlp.up_proj.weight' holds 1 NaN/Inf" in str(err.value)
    assert "[7, 1]" in str(err.value)


@pytest.mark.parametrize("saved_as,declared", [("float16", "BF16"), ("bfloat16", "F16")])
def test_relabelled_2byte_dtype_refused(tmp_path, saved_as, declared):
    path, _ = saved(tmp_path, dtype=saved_as)
    st = os.path.join(path, "model.safetensors")
    relabel(st, declared)
    likely = {"BF16": "F16", "F16": "BF16"}[declared]
    with pytest.raises(CheckpointError, match=f"'fc.weight' is declared {declared}, but its bytes look like {likely}") \
            as err:
        load_draft_checkpoint(path, TEACHER)
    assert st in str(err.value)


def test_seeded_random_drafts_load_in_every_dtype(tmp_path):
    for seed in range(3):
        for dtype in ("float16", "bfloat16"):
            path, _ = saved(tmp_path, seed=seed, dtype=dtype, name=f"{dtype}-{seed}")
            load_draft_checkpoint(path, TEACHER)


def test_shipped_demo_draft_loads_and_its_relabelled_copies_do_not(tmp_path):
    """The trained demo draft (fp16) loads; relabelled BF16, or saved as bf16 and relabelled F16, it is refused."""
    teacher = load_config(os.path.join(REPO, "configs", "demo.yaml")).model
    cfg, state = load_draft_checkpoint(os.path.join(DEMO_DIR, "draft"), teacher)
    assert cfg.draft_vocab_size == state["d2t"].size == 512
    for saved_as, declared in (("float16", "BF16"), ("bfloat16", "F16")):
        out = str(tmp_path / saved_as)
        save_draft_checkpoint(state, cfg, out, saved_as)
        relabel(os.path.join(out, "model.safetensors"), declared)
        with pytest.raises(CheckpointError, match=f"'fc.weight' is declared {declared}, but its bytes look like"):
            load_draft_checkpoint(out, teacher)


@pytest.mark.parametrize("offset,target", [(60, 65), (-6, -1)])
def test_d2t_target_out_of_range_names_position_and_value(tmp_path, offset, target):
    """Every mapped target id (draft id + d2t[draft id]) must lie in [0, teacher vocab)."""
    path, state = saved(tmp_path)
    d2t = state["d2t"].copy()
    d2t[5] = offset  # draft id 5 -> target id 5 + offset
    rewrite(path, edit_tensors=_set("d2t", d2t))
    with pytest.raises(CheckpointError) as err:
        load_draft_checkpoint(path, TEACHER)
    msg = str(err.value)
    assert os.path.join(path, "model.safetensors") in msg and "1 draft id(s)" in msg, msg
    assert f"d2t[5] = {offset} maps draft id 5 to target id {target}" in msg and "[0, vocab_size=64)" in msg, msg
