"""eagle_ms/models/param_layout.py: HF checkpoint tensors <-> packed, [in, out] Cell parameters.

Second implementation: tests/helpers_layout.py reads the raw parameters by name pattern from the
documented layout; the forward itself is checked against the HF-layout NumPy reference in
test_pangu_model.py and test_eagle3_model.py.
"""
import numpy as np
import pytest

from helpers_layout import hf_state_from_cell, raw_parameters
from eagle_ms.config import ModelConfig
from eagle_ms.draft_weights import default_draft_config, draft_state, load_draft_state, random_draft_state
from eagle_ms.models.eagle3 import Eagle3Draft
from eagle_ms.models.param_layout import checkpoint_slots, state_from_params
from eagle_ms.models.pangu import PanguForCausalLM
from eagle_ms.weights import expected_teacher_keys, load_state, model_state, random_teacher_state

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, bias=True)


def test_worked_example_of_the_module_doc():
    """k_proj of layer 0 is columns [Hq*D, Hq*D + Hkv*D) of qkv_proj, transposed; its bias the same range."""
    model = PanguForCausalLM(CFG, 1, 8)
    state = random_teacher_state(CFG, 3)
    load_state(model, state)
    raw = raw_parameters(model)
    w = raw["model.layers.0.self_attn.qkv_proj.weight"]  # [H, (Hq + 2 Hkv) D] = [32, 64]
    assert w.shape == (32, 64)
    np.testing.assert_array_equal(w[:, 32:48].T, state["model.layers.0.self_attn.k_proj.weight"])
    np.testing.assert_array_equal(raw["model.layers.0.self_attn.qkv_proj.bias"][48:],
                                  state["model.layers.0.self_attn.v_proj.bias"])
    np.testing.assert_array_equal(raw["model.layers.2.mlp.gate_up_proj.weight"][:, 48:].T,
                                  state["model.layers.2.mlp.up_proj.weight"])
    np.testing.assert_array_equal(raw["lm_head.weight"].T, state["lm_head.weight"])
    slot = checkpoint_slots(model)["model.layers.0.self_attn.k_proj.weight"]
    assert (slot.param_name, slot.start, slot.stop, slot.transpose, slot.shape) == \
        ("model.layers.0.self_attn.qkv_proj.weight", 32, 48, True, (16, 32))


@pytest.mark.parametrize("bias,tie", [(True, False), (False, True)])
def test_teacher_round_trip_equals_the_tests_own_reading(bias, tie):
    cfg = ModelConfig(**{**CFG.__dict__, "bias": bias, "tie_word_embeddings": tie})
    model = PanguForCausalLM(cfg, 1, 8)
    state = random_teacher_state(cfg, 5)
    load_state(model, state)
    slots = checkpoint_slots(model)
    assert {k: s.shape for k, s in slots.items()} == expected_teacher_keys(cfg)
    assert list(slots) == list(expected_teacher_keys(cfg))  # checkpoint order
    ours, theirs = model_state(model), hf_state_from_cell(model, cfg.num_attention_heads * cfg.head_dim)
    assert set(ours) == set(theirs) == set(state)
    for key in state:
        np.testing.assert_array_equal(ours[key], state[key], err_msg=key)
        np.testing.assert_array_equal(theirs[key], state[key], err_msg=key)


def test_draft_round_trip_equals_the_tests_own_reading():
    dcfg = default_draft_config(CFG, draft_vocab_size=16)
    draft = Eagle3Draft(dcfg, 1, 8, 2)
    state = random_draft_state(dcfg, 4)
    load_draft_state(draft, state, embed=np.zeros((CFG.vocab_size, CFG.hidden_size), np.float32))
    got = draft_state(draft)
    theirs = hf_state_from_cell(draft, dcfg.num_attention_heads * dcfg.head_dim)
    for key, value in state.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
        if key not in ("d2t", "t2d"):
            np.testing.assert_array_equal(theirs[key], value, err_msg=key)
    assert state_from_params(checkpoint_slots(draft))["midlayer.self_attn.q_proj.weight"].shape == \
        (dcfg.num_attention_heads * dcfg.head_dim, 2 * dcfg.hidden_size)
