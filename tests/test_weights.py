"""Teacher checkpoints: round trips (single file, shards, fp16, bf16), strict errors, config checks.

Expectations are independent of eagle_ms.weights: keys/shapes come from the Cell itself, files are
cross-read with the ``safetensors`` package, and the BF16 file is assembled byte by byte here.
"""
import json
import os
import struct

import numpy as np
import pytest
import safetensors.numpy as stnp

import mindspore as ms

from conftest import REPO
from helpers_safetensors import relabel
from eagle_ms.config import ModelConfig
from eagle_ms.models.pangu import PanguForCausalLM
from eagle_ms.runtime import build_teacher
from eagle_ms.assets import DEMO_DIR
from eagle_ms.config import load_config
from eagle_ms.safetensors_format import (CheckpointError, SafetensorsFile, check_float_tensor, read_safetensors,
                                         write_safetensors)
from eagle_ms.weights import (check_checkpoint_config, expected_teacher_keys, load_state, load_teacher_checkpoint,
                              model_state, random_teacher_state, save_teacher_checkpoint)

from helpers_layout import hf_state_from_cell

BIAS_TIE = [(True, False), (False, False), (True, True), (False, True)]
Q_KEY = "model.layers.0.self_attn.q_proj.weight"
UP_KEY = "model.layers.1.mlp.up_proj.weight"


def tiny_cfg(bias=True, tie=False, **changes):
    fields = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, bias=bias, tie_word_embeddings=tie)
    fields.update(changes)
    return ModelConfig(**fields)


def new_model(cfg):
    return PanguForCausalLM(cfg, batch=1, capacity=8, backend="eager")


def cell_state(model):
    """Checkpoint content read straight from the Cell's parameters (tests/helpers_layout.py, not the
    code's param_layout), HF keys and layout."""
    q_out = model.config.num_attention_heads * model.config.head_dim
    return hf_state_from_cell(model, q_out)


def assert_state_equal(got, want):
    assert set(got) == set(want)
    for key in want:
        assert got[key].dtype == np.float32, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def write_raw_safetensors(path, tensors):
    """Minimal independent writer: tensors = {key: (tag, shape, raw_bytes)}."""
    header, offset, blob = {}, 0, b""
    for key, (tag, shape, raw) in tensors.items():
        header[key] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blob += raw
    head = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(head)) + head + blob)


# ---------------------------------------------------------------- keys and random state

@pytest.mark.parametrize("bias,tie", BIAS_TIE)
def test_expected_keys_equal_cell_parameters(bias, tie):
    cfg = tiny_cfg(bias, tie)
    model = new_model(cfg)
    keys = expected_teacher_keys(cfg)
    assert keys == {k: v.shape for k, v in cell_state(model).items()}
    assert len(keys) == 2 + 4 * (9 + 4 * bias) + (0 if tie else 1)
    assert set(model_state(model)) == set(keys)  # caches excluded
    assert keys["model.layers.3.self_attn.k_proj.weight"] == (16, 32)  # [Hkv*D, H] = [2*8, 32]
    assert keys["model.layers.3.mlp.down_proj.weight"] == (32, 64)  # [out, in]


def test_random_state_seeded_and_pinned():
    cfg = tiny_cfg()
    a, b, c = random_teacher_state(cfg, 0), random_teacher_state(cfg, 0), random_teacher_state(cfg, 1)
    assert list(a) == list(expected_teacher_keys(cfg))
    assert_state_equal(a, b)
    assert not np.array_equal(a[Q_KEY], c[Q_KEY])
    # pinned values: the same numbers on every machine
    np.testing.assert_allclose(a["model.norm.weight"][:3], [1.000337, 1.0314682, 0.98669845], rtol=1e-6)
    np.testing.assert_allclose(a["model.layers.0.self_attn.q_proj.bias"][:3],
                               [-0.01537004, 0.02324306, 0.01498894], rtol=1e-6)
    np.testing.assert_allclose(a["model.embed_tokens.weight"][0, :3], [0.00185736, 0.01845673, 0.00598412],
                               rtol=1e-6)
    norm = a["model.layers.2.input_layernorm.weight"]
    assert np.all(np.abs(norm - 1) < 0.2) and np.std(norm) > 0.005  # 1 + noise, not all ones
    # a tensor does not depend on which other keys exist
    np.testing.assert_array_equal(random_teacher_state(tiny_cfg(False, True), 0)[Q_KEY], a[Q_KEY])


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("bias,tie", BIAS_TIE)
def test_round_trip_single_file(tmp_path, bias, tie):
    cfg = tiny_cfg(bias, tie)
    state = random_teacher_state(cfg, 3)
    written = save_teacher_checkpoint(state, cfg, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted(written) == ["config.json", "model.safetensors"]
    assert_state_equal(stnp.load_file(str(tmp_path / "model.safetensors")), state)  # independent reader
    model = new_model(cfg)
    assert not np.array_equal(cell_state(model)[Q_KEY], state[Q_KEY])
    load_teacher_checkpoint(model, str(tmp_path))
    assert_state_equal(cell_state(model), state)
    model2 = new_model(cfg)
    load_teacher_checkpoint(model2, str(tmp_path / "model.safetensors"))  # the file itself
    assert_state_equal(cell_state(model2), state)


@pytest.mark.parametrize("bias,tie", [(True, False), (False, True)])
def test_round_trip_sharded(tmp_path, bias, tie):
    cfg = tiny_cfg(bias, tie)
    state = random_teacher_state(cfg, 4)
    limit = 4 * 96 * 32  # the embedding alone fills one shard
    written = save_teacher_checkpoint(state, cfg, str(tmp_path), max_shard_bytes=limit)
    shards = sorted(n for n in os.listdir(tmp_path) if n.startswith("model-"))
    assert len(shards) >= 3 and shards == sorted(written[:-2])
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(state)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in state.values())
    merged = {}
    for name in shards:
        part = stnp.load_file(str(tmp_path / name))
        assert sum(v.nbytes for v in part.values()) <= limit
        assert all(index["weight_map"][k] == name for k in part)
        merged.update(part)
    assert_state_equal(merged, state)
    assert not (tmp_path / "model.safetensors").exists()
    model = new_model(cfg)
    load_teacher_checkpoint(model, str(tmp_path))
    assert_state_equal(cell_state(model), state)


def test_resave_other_layout_removes_stale_files(tmp_path):
    cfg = tiny_cfg()
    save_teacher_checkpoint(random_teacher_state(cfg, 1), cfg, str(tmp_path), max_shard_bytes=20000)
    state = random_teacher_state(cfg, 2)
    save_teacher_checkpoint(state, cfg, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    model = new_model(cfg)
    load_teacher_checkpoint(model, str(tmp_path))
    assert_state_equal(cell_state(model), state)


def test_save_model_then_build_teacher(tmp_path):
    cfg = tiny_cfg()
    src = build_teacher(cfg, None, batch=1, capacity=8, backend="eager", seed=7)
    assert_state_equal(cell_state(src), random_teacher_state(cfg, 7))
    save_teacher_checkpoint(src, cfg, str(tmp_path), max_shard_bytes=30000)
    cfg_json = json.loads((tmp_path / "config.json").read_text())
    assert cfg_json["hidden_size"] == 32 and cfg_json["num_key_value_heads"] == 2 and cfg_json["bias"] is True
    dst = build_teacher(cfg, str(tmp_path), batch=1, capacity=8, backend="eager")
    assert_state_equal(cell_state(dst), random_teacher_state(cfg, 7))


def test_fp16_file_loads_converted(tmp_path):
    cfg = tiny_cfg()
    state = random_teacher_state(cfg, 5)
    save_teacher_checkpoint(state, cfg, str(tmp_path), dtype="float16")
    assert all(v.dtype == np.float16 for v in stnp.load_file(str(tmp_path / "model.safetensors")).values())
    model = new_model(cfg)
    load_teacher_checkpoint(model, str(tmp_path))
    assert_state_equal(cell_state(model), {k: v.astype(np.float16).astype(np.float32) for k, v in state.items()})


def bf16_truncate(x):
    """fp32 -> (bf16 bits by truncation, the fp32 values those bits mean)."""
    bits = (np.ascontiguousarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_handwritten_bf16_file_loads(tmp_path, compute_dtype):
    cfg = tiny_cfg(compute_dtype=compute_dtype)
    state = random_teacher_state(cfg, 6)
    tensors, want = {}, {}
    for key, value in state.items():
        bits, want[key] = bf16_truncate(value)
        tensors[key] = ("BF16", value.shape, bits.astype("<u2").tobytes())
    assert not np.array_equal(want[Q_KEY], state[Q_KEY])  # truncation changed the values
    path = tmp_path / "teacher.safetensors"
    write_raw_safetensors(path, tensors)
    model = new_model(cfg)
    load_teacher_checkpoint(model, str(path))
    assert_state_equal(cell_state(model), want)  # bf16 -> fp32 and bf16 -> bf16 are both exact


def test_fp32_into_fp16_model_and_reader_dtypes(tmp_path):
    cfg = tiny_cfg(compute_dtype="float16")
    state = random_teacher_state(cfg, 8)
    model = new_model(cfg)
    load_state(model, state)
    assert all(p.dtype == ms.float16 for n, p in model.parameters_and_names() if not n.endswith("_cache"))
    got = cell_state(model)
    assert_state_equal({k: v.astype(np.float32) for k, v in got.items()},
                       {k: v.astype(np.float16).astype(np.float32) for k, v in state.items()})
    # the reader against files written by the safetensors package, every supported dtype
    rng = np.random.default_rng(0)
    arrays = {"f64": rng.standard_normal((2, 3)), "f32": rng.standard_normal(5).astype(np.float32),
              "f16": rng.standard_normal((4, 1)).astype(np.float16), "i64": np.arange(6).reshape(2, 3),
              "i32": np.arange(-3, 3, dtype=np.int32), "u8": np.arange(7, dtype=np.uint8),
              "bool": np.array([True, False, True]), "scalar": np.array(2.5, np.float32)}
    stnp.save_file(arrays, str(tmp_path / "all.safetensors"))
    back = read_safetensors(str(tmp_path / "all.safetensors"))
    for key, value in arrays.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        np.testing.assert_array_equal(back[key], value)
    write_safetensors(str(tmp_path / "ours.safetensors"), arrays, float_dtype="bfloat16")
    ours = read_safetensors(str(tmp_path / "ours.safetensors"))
    np.testing.assert_allclose(ours["f32"], arrays["f32"], rtol=2 ** -8)  # bf16: 8 significant bits
    np.testing.assert_array_equal(ours["i64"], arrays["i64"])


def test_inv_freq_key_ignored(tmp_path):
    cfg = tiny_cfg()
    state = random_teacher_state(cfg, 9)
    extra = dict(state)
    extra["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)
    extra["model.layers.3.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)
    stnp.save_file(extra, str(tmp_path / "model.safetensors"))
    model = new_model(cfg)
    load_teacher_checkpoint(model, str(tmp_path))
    assert_state_equal(cell_state(model), state)


# ---------------------------------------------------------------- errors

def error_of(fn, *args):
    with pytest.raises(CheckpointError) as info:
        fn(*args)
    return str(info.value)


def test_missing_unexpected_and_misshapen_keys(tmp_path):
    cfg = tiny_cfg()
    model = new_model(cfg)
    before = cell_state(model)
    state = random_teacher_state(cfg, 1)
    path = str(tmp_path / "bad.safetensors")
    cases = {
        "missing": ({k: v for k, v in state.items() if k != UP_KEY}, [UP_KEY, "(64, 32)", path]),
        "unexpected": ({**state, "model.layers.9.foo.weight": np.zeros(3, np.float32)},
                       ["model.layers.9.foo.weight", "(3,)", path]),
        "shape": ({**state, Q_KEY: np.zeros((32, 31), np.float32)}, [Q_KEY, "(32, 31)", "(32, 32)", path]),
        "dtype": ({**state, UP_KEY: np.zeros((64, 32), np.int32)}, [UP_KEY, "I32", path]),
    }
    for name, (bad, needles) in cases.items():
        stnp.save_file(bad, path)
        msg = error_of(load_teacher_checkpoint, model, path)
        assert all(n in msg for n in needles), (name, msg)
    msg = error_of(load_state, model, {k: v for k, v in state.items() if k != UP_KEY}, "demo.npz")
    assert UP_KEY in msg and "(64, 32)" in msg and "demo.npz" in msg
    assert_state_equal(cell_state(model), before)  # nothing was loaded by a failing call
    assert isinstance(CheckpointError("x"), ValueError)


def test_missing_shard_and_index_entry_without_tensor(tmp_path):
    cfg = tiny_cfg()
    save_teacher_checkpoint(random_teacher_state(cfg, 1), cfg, str(tmp_path), max_shard_bytes=20000)
    index_path = tmp_path / "model.safetensors.index.json"
    good = index_path.read_text()
    index = json.loads(good)
    shards = sorted(set(index["weight_map"].values()))
    key_elsewhere = next(k for k, v in index["weight_map"].items() if v != shards[0])
    index["weight_map"][key_elsewhere] = shards[0]
    index_path.write_text(json.dumps(index))
    msg = error_of(load_teacher_checkpoint, new_model(cfg), str(tmp_path))
    assert key_elsewhere in msg and shards[0] in msg
    index_path.write_text(good)
    load_teacher_checkpoint(new_model(cfg), str(tmp_path))  # the intact checkpoint loads
    os.remove(tmp_path / shards[1])
    msg = error_of(load_teacher_checkpoint, new_model(cfg), str(tmp_path))
    assert shards[1] in msg and "does not exist" in msg


def test_truncated_and_corrupt_files(tmp_path):
    cfg = tiny_cfg()
    save_teacher_checkpoint(random_teacher_state(cfg, 1), cfg, str(tmp_path))
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    variants = {"tail": data[:-10], "in_header": data[:8 + n // 2], "no_length": data[:5],
                "bad_json": data[:8] + b"{" * n + data[8 + n:]}
    model = new_model(cfg)
    for name, blob in variants.items():
        path.write_bytes(blob)
        msg = error_of(load_teacher_checkpoint, model, str(tmp_path))
        assert str(path) in msg, (name, msg)
    path.write_bytes(data[:-10])
    assert "truncated" in error_of(load_teacher_checkpoint, model, str(tmp_path))
    assert "not found" in error_of(load_teacher_checkpoint, model, str(tmp_path / "nope"))


def test_each_file_is_mapped_once_and_loaded_from_the_checked_bytes(tmp_path, monkeypatch):
    """Read once: every shard is memory-mapped once, the copying reader is never used, and shards replaced
    on disk after the last check (by a checkpoint holding NaN) do not reach the model: it gets the checked
    bytes."""
    import eagle_ms.safetensors_format as sf
    import eagle_ms.weights as weights

    cfg = tiny_cfg()
    state = random_teacher_state(cfg, 1)
    names = save_teacher_checkpoint(state, cfg, str(tmp_path / "ckpt"), max_shard_bytes=40_000)
    shards = [n for n in names if n.endswith(".safetensors")]
    poison = {k: v * 2 for k, v in state.items()}
    poison["model.norm.weight"][0] = np.nan
    assert save_teacher_checkpoint(poison, cfg, str(tmp_path / "poison"), max_shard_bytes=40_000) == names
    assert len(shards) >= 3
    maps, checked, real_mmap, real_check = [], [], sf.mmap.mmap, weights.check_float_tensor

    def check_then_replace(key, arr, tag, source):
        real_check(key, arr, tag, source)
        checked.append(key)
        if len(checked) == len(state):  # every tensor checked: now swap the files under the loader
            for name in shards:
                os.replace(tmp_path / "poison" / name, tmp_path / "ckpt" / name)

    monkeypatch.setattr(sf.mmap, "mmap", lambda *a, **kw: maps.append(a) or real_mmap(*a, **kw))
    monkeypatch.setattr(sf.SafetensorsFile, "read", lambda self, key: pytest.fail(f"copying read of {key}"))
    monkeypatch.setattr(weights, "check_float_tensor", check_then_replace)
    model = new_model(cfg)
    load_teacher_checkpoint(model, str(tmp_path / "ckpt"))
    assert len(maps) == len(shards) and sorted(checked) == sorted(state)
    assert_state_equal(cell_state(model), state)
    replaced = {}
    for name in shards:
        replaced.update(stnp.load_file(str(tmp_path / "ckpt" / name)))
    assert np.isnan(replaced["model.norm.weight"][0])  # the files on disk now hold the poison


def write_with_offsets(path, offsets, data_bytes):
    """F32 tensors of 2 elements at the given data_offsets over ``data_bytes`` zero bytes."""
    header = {k: {"dtype": "F32", "shape": [(end - begin) // 4], "data_offsets": [begin, end]}
              for k, (begin, end) in offsets.items()}
    head = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(head)) + head + bytes(data_bytes))


LAYOUTS = {  # tensor -> data_offsets, data section bytes, what the error must say
    "overlap": ({"a": (0, 8), "b": (4, 12)}, 12, ["'a' [0, 8)", "'b' [4, 12)", "overlap"]),
    "gap": ({"a": (0, 8), "b": (12, 20)}, 20, ["gap", "[8, 12)", "'a'", "'b'"]),
    "leading gap": ({"a": (4, 12)}, 12, ["gap", "[0, 4)", "'a'"]),
    "trailing bytes": ({"a": (0, 8)}, 12, ["4 byte(s) in the data section after the last tensor 'a'"]),
    "data, no tensor": ({}, 4, ["4 byte(s) in the data section but no tensor"]),
}


@pytest.mark.parametrize("case", sorted(LAYOUTS))
def test_overlapping_or_gapped_data_refused_like_the_reference_reader(tmp_path, case):
    offsets, data_bytes, needles = LAYOUTS[case]
    path = str(tmp_path / "layout.safetensors")
    write_with_offsets(path, offsets, data_bytes)
    with pytest.raises(Exception, match="offset|not fully covered"):
        stnp.load_file(path)  # the reference library refuses it too
    msg = error_of(SafetensorsFile, path)
    assert path in msg and all(n in msg for n in needles), msg


def test_contiguous_data_with_empty_tensors_reads(tmp_path):
    path = str(tmp_path / "ok.safetensors")
    write_with_offsets(path, {"z": (0, 0), "a": (0, 8), "e": (8, 8), "b": (8, 16)}, 16)
    assert set(stnp.load_file(path)) == set(SafetensorsFile(path).keys()) == {"z", "a", "e", "b"}


def test_config_json_mismatch(tmp_path):
    cfg = tiny_cfg()
    save_teacher_checkpoint(random_teacher_state(cfg, 1), cfg, str(tmp_path))
    other = tiny_cfg(intermediate_size=48, num_hidden_layers=3)
    msg = error_of(build_teacher, other, str(tmp_path), 1, 8, "eager")
    assert "intermediate_size: checkpoint 64 != config 48" in msg
    assert "num_hidden_layers: checkpoint 4 != config 3" in msg and "config.json" in msg
    msg = error_of(build_teacher, tiny_cfg(bias=False), str(tmp_path), 1, 8, "eager")
    assert "bias: checkpoint True != config False" in msg


CONFIG_DISAGREES = {  # config.json edit -> what the error must say (tiny_cfg: eos 2, 32768 positions)
    "eos": ({"eos_token_id": 7}, "eos_token_id: checkpoint 7 != config 2"),
    "eos list": ({"eos_token_id": [7, 9]}, "eos_token_id: checkpoint [7, 9] does not contain config 2"),
    "positions": ({"max_position_embeddings": 4096}, "max_position_embeddings: checkpoint 4096 != config 32768"),
    "aux ids": ({"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
                "eagle_aux_hidden_state_layer_ids: checkpoint [1, 2, 3] != config aux_layer_ids [0, 2, 3]"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_DISAGREES))
def test_config_json_eos_aux_ids_and_positions_must_agree(tmp_path, case):
    edit, needle = CONFIG_DISAGREES[case]
    cfg = tiny_cfg()
    assert cfg.aux_layer_ids == (0, 2, 3)
    save_teacher_checkpoint(random_teacher_state(cfg, 1), cfg, str(tmp_path))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    msg = error_of(build_teacher, cfg, str(tmp_path), 1, 8, "eager")
    assert needle in msg and str(path) in msg, msg


def test_config_json_agreeing_eos_list_and_absent_fields_pass(tmp_path):
    cfg = tiny_cfg()
    save_teacher_checkpoint(random_teacher_state(cfg, 1), cfg, str(tmp_path))
    path = tmp_path / "config.json"
    raw = json.loads(path.read_text())
    for name in ("max_position_embeddings", "eagle_aux_hidden_state_layer_ids"):
        raw.pop(name)
    path.write_text(json.dumps({**raw, "eos_token_id": [7, 2]}))  # HF lists several stop ids
    check_checkpoint_config(cfg, str(tmp_path))
    for not_an_object in ("[1, 2]", "3", '"x"'):
        path.write_text(not_an_object)
        msg = error_of(check_checkpoint_config, cfg, str(tmp_path))
        assert str(path) in msg and "not a JSON object" in msg, msg


def test_shipped_demo_config_agrees_with_shipped_teacher():
    cfg = load_config(os.path.join(REPO, "configs", "demo.yaml"))
    check_checkpoint_config(cfg.model, os.path.join(DEMO_DIR, "teacher"))


def test_save_rejects_state_that_does_not_fit(tmp_path):
    cfg = tiny_cfg()
    state = random_teacher_state(cfg, 1)
    msg = error_of(save_teacher_checkpoint, {**state, Q_KEY: np.zeros((2, 2), np.float32)}, cfg, str(tmp_path))
    assert Q_KEY in msg and "(2, 2)" in msg
    assert not os.listdir(tmp_path)


# ---------------------------------------------------------------- values: NaN/Inf, relabelled dtypes

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_refused_naming_file_and_tensor_model_unchanged(tmp_path, dtype, bad):
    cfg = tiny_cfg()
    state = random_teacher_state(cfg, 1)
    state["lm_head.weight"][3, 5] = bad  # the last tensor: a one-pass loader would have set all others
    save_teacher_checkpoint(state, cfg, str(tmp_path), dtype=dtype)
    model = new_model(cfg)
    before = cell_state(model)
    msg = error_of(load_teacher_checkpoint, model, str(tmp_path))
    assert str(tmp_path / "model.safetensors") in msg and "'lm_head.weight'" in msg, msg
    assert "1 NaN/Inf value(s)" in msg and "[3, 5]" in msg, msg
    assert_state_equal(cell_state(model), before)
    with pytest.raises(CheckpointError, match="'lm_head.weight' holds 1 NaN/Inf"):
        load_state(model, state, "<state>")  # in-memory states get the same check


@pytest.mark.parametrize("saved_as,declared", [("float16", "BF16"), ("bfloat16", "F16")])
def test_relabelled_2byte_dtype_refused_model_unchanged(tmp_path, saved_as, declared):
    cfg = tiny_cfg()
    save_teacher_checkpoint(random_teacher_state(cfg, 2), cfg, str(tmp_path), dtype=saved_as)
    relabel(str(tmp_path / "model.safetensors"), declared)
    model = new_model(cfg)
    before = cell_state(model)
    msg = error_of(load_teacher_checkpoint, model, str(tmp_path))
    likely = {"BF16": "F16", "F16": "BF16"}[declared]
    assert str(tmp_path / "model.safetensors") in msg and "'model.embed_tokens.weight'" in msg, msg
    assert f"declared {declared}, but its bytes look like {likely}" in msg, msg
    assert_state_equal(cell_state(model), before)


def _as_declared(values, stored, declared):
    """What a reader returns for ``values`` stored as ``stored`` bits but declared ``declared``."""
    if stored == "F16":
        bits = np.asarray(values, np.float32).astype(np.float16).view(np.uint16)
    else:
        bits = bf16_truncate(values)[0]
    return bits.view(np.float16) if declared == "F16" else (bits.astype(np.uint32) << 16).view(np.float32)


GAUSS = np.random.default_rng(0).standard_normal(4096) * 0.02
DTYPE_CHECK = {  # name: (values, stored as, declared, refused?)
    "F16 weights read as BF16": (GAUSS, "F16", "BF16", True),
    "BF16 weights read as F16": (GAUSS, "BF16", "F16", True),
    "F16 weights of 63 elements read as BF16": (GAUSS[:63], "F16", "BF16", False),  # too few to judge
    "all-zero tensor relabelled": (np.zeros(4096), "F16", "BF16", False),  # zeros mean the same in both
    "F16 norm weights ~1 read as BF16": (1 + GAUSS, "F16", "BF16", False),  # ~0.008: still plausible
    "BF16 norm weights ~1 read as F16": (1 + GAUSS, "BF16", "F16", False),  # ~1.9: still plausible
    "F16 weights of median 1.3 read as BF16": (GAUSS * 100, "F16", "BF16", False),  # ~0.01: plausible
    "BF16 weights of 1000 elements read as F16": (GAUSS[:1000], "BF16", "F16", False),  # near-zero test needs 1024
    "F16 weights read as F16": (GAUSS, "F16", "F16", False),
    "BF16 weights read as BF16": (GAUSS, "BF16", "BF16", False),
    "F16 tiny weights (std 1e-6) read as F16": (GAUSS * 5e-5, "F16", "F16", False),
    "BF16 weights, 2% exact zeros, read as F16": (np.where(np.arange(4096) % 50, GAUSS, 0), "BF16", "F16", True),
}


@pytest.mark.parametrize("case", sorted(DTYPE_CHECK))
def test_dtype_plausibility_catches_and_misses(case):
    """Exactly what check_float_tensor's relabel test catches (the two 2-byte mix-ups on zero-centred
    weights) and what it does not (norm-like tensors, tiny or zero tensors): see its docstring."""
    values, stored, declared, refused = DTYPE_CHECK[case]
    arr = _as_declared(values, stored, declared)
    if refused:
        with pytest.raises(CheckpointError, match=f"'w' is declared {declared}, but its bytes look like {stored}"):
            check_float_tensor("w", arr, declared, "f.safetensors")
    else:
        check_float_tensor("w", arr, declared, "f.safetensors")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("std", [0.02, 0.3])
def test_seeded_random_weights_load_in_every_dtype(tmp_path, dtype, std):
    cfg = tiny_cfg()
    for seed in range(3):
        save_teacher_checkpoint(random_teacher_state(cfg, seed, std), cfg, str(tmp_path / str(seed)), dtype=dtype)
        load_teacher_checkpoint(new_model(cfg), str(tmp_path / str(seed)))


def test_shipped_demo_teacher_loads():
    cfg = load_config(os.path.join(REPO, "configs", "demo.yaml"))
    load_teacher_checkpoint(PanguForCausalLM(cfg.model, 1, 8, "eager"), os.path.join(DEMO_DIR, "teacher"))
