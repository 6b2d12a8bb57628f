"""Pangu teacher Cell vs an independent NumPy float64 forward (tests/numpy_reference.py).

Covers: full-sequence logits/aux for bias on/off, GQA/MHA, tied/untied (GQA with bias also with the fused CPU
kernels); tree-like positions and masks;
batch 2; incremental decoding through the static cache (chunked prefill + decode) == one full forward;
GRAPH_MODE == PyNative; no recompilation for new values of a compiled shape; prompt-fit errors; aux
layer id defaults and validation. Tiny seeded models, CPU; compiled models are shared per module.
"""
import dataclasses

import numpy as np
import pytest
from helpers_layout import hf_state_from_cell

import mindspore as ms
from mindspore import Tensor

from eagle_ms.config import ModelConfig
from eagle_ms.models.layers import Rotary, apply_rope, half_swap_index, rope_inv_freq, swap_halves
from eagle_ms.models.pangu import PanguForCausalLM
from eagle_ms.teacher import TeacherRunner, causal_chunk_mask
from eagle_ms.weights import load_state, random_teacher_state
from numpy_reference import random_state, reference_forward

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

TOL = 1e-4  # fp32 Cell vs fp64 reference, relative to max |reference|

GQA_BIAS_UNTIED = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, bias=True,
                              tie_word_embeddings=False)
MHA_NOBIAS_TIED = ModelConfig(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=4, bias=False,
                              tie_word_embeddings=True, rope_theta=500.0)
# head_dim != hidden / heads (openPangu-style explicit head_dim), GQA, tied, bias, 5 layers.
GQA_HEADDIM_TIED = ModelConfig(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=5,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, bias=True,
                               tie_word_embeddings=True, rms_norm_eps=1e-6)
CONFIGS = {"gqa-bias-untied": GQA_BIAS_UNTIED, "mha-nobias-tied": MHA_NOBIAS_TIED,
           "gqa-headdim16-tied": GQA_HEADDIM_TIED}
CAPACITY = 24
SEQ = 12  # full-forward length in the parity tests


# ----------------------------------------------------------------------------------------------- helpers

def build(cfg, seed, batch=1, capacity=CAPACITY, kernels="composite"):
    """A seeded PanguForCausalLM with weights std 0.2 (logits far from flat); returns (model, state)."""
    model = PanguForCausalLM(cfg, batch, capacity, kernels=kernels)
    model.set_train(False)
    state = random_teacher_state(cfg, seed, std=0.2)
    load_state(model, state)
    return model, state


def run_cell(model, ids, positions, slots, allowed):
    """ids/positions/slots [B, N] int, allowed [B, N, S] bool -> (logits, aux) as numpy."""
    logits, aux = model(Tensor(np.asarray(ids, np.int32)), Tensor(np.asarray(positions, np.int32)),
                        Tensor(np.asarray(slots, np.int32)), Tensor(np.asarray(allowed, bool)))
    return logits.asnumpy(), aux.asnumpy()


def full_forward_cell(model, tokens):
    """One call over the whole sequence at slots/positions 0..T-1 with a causal mask (batch 1)."""
    t = len(tokens)
    ar = np.arange(t)[None]
    logits, aux = run_cell(model, np.asarray(tokens)[None], ar, ar, causal_chunk_mask(0, t, model.capacity)[None])
    return logits[0], aux[0]


def rel_err(actual, expected):
    return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def assert_close(actual, expected, tol=TOL, what=""):
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    err = rel_err(actual, expected)
    assert err < tol, f"{what}: relative error {err:.3e} >= {tol:g}"


def tokens_for(cfg, seed, n):
    return np.random.default_rng(seed).integers(3, cfg.vocab_size, size=n)


# ----------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module", params=sorted(CONFIGS) + ["gqa-bias-untied:cpu"])
def parity_model(request):
    """``name:cpu``: the teacher built with the fused CPU kernels (eagle_ms/models/cpu_kernels.py)."""
    name, _, kernels = request.param.partition(":")
    cfg = CONFIGS[name]
    model, state = build(cfg, seed=1, kernels=kernels or "composite")
    return request.param, cfg, model, state


@pytest.fixture(scope="module")
def runner_model():
    """Batch-1 GQA model shared by the cache / runner / compile-count tests."""
    return build(GQA_BIAS_UNTIED, seed=7, capacity=32)


# ------------------------------------------------------------------------ 0. the reference's own sanity

@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_reference_keys_and_shapes_match_library(name):
    """The reference's hand-written HF layout == the library's checkpoint keys and shapes, and == the Cell's
    parameters read back in the HF layout by the tests' own reader (tests/helpers_layout.py)."""
    cfg = CONFIGS[name]
    ours = {k: v.shape for k, v in random_state(cfg, 0).items()}
    theirs = {k: v.shape for k, v in random_teacher_state(cfg, 0).items()}
    assert ours == theirs
    model = PanguForCausalLM(cfg, 1, 8)
    params = {n: v.shape for n, v in hf_state_from_cell(model, cfg.num_attention_heads * cfg.head_dim).items()}
    assert params == ours


def test_reference_gqa_equals_mha_with_repeated_kv_heads():
    """The reference's repeat_kv convention: GQA == MHA whose kv head h is kv head h // group."""
    gqa = GQA_BIAS_UNTIED
    mha = dataclasses.replace(gqa, num_key_value_heads=gqa.num_attention_heads)
    state = random_state(gqa, seed=3)
    group, d = gqa.num_kv_groups, gqa.head_dim
    expanded = dict(state)
    for key, arr in state.items():
        if any(f"self_attn.{n}_proj" in key for n in ("k", "v")):
            heads = arr.reshape(gqa.num_key_value_heads, d, *arr.shape[1:])
            expanded[key] = np.repeat(heads, group, axis=0).reshape(-1, *arr.shape[1:])
    toks = tokens_for(gqa, 0, 9)
    a, b = reference_forward(gqa, state, toks), reference_forward(mha, expanded, toks)
    np.testing.assert_allclose(a.logits, b.logits, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(a.aux, b.aux, rtol=1e-12, atol=1e-12)


def test_reference_is_causal_and_not_flat():
    cfg = GQA_BIAS_UNTIED
    state = random_state(cfg, seed=4)
    toks = tokens_for(cfg, 1, 10)
    other = toks.copy()
    other[6:] = (other[6:] + 5) % cfg.vocab_size
    a, b = reference_forward(cfg, state, toks), reference_forward(cfg, state, other)
    np.testing.assert_allclose(a.logits[:6], b.logits[:6], rtol=1e-12, atol=1e-12)
    assert not np.allclose(a.logits[6:], b.logits[6:])
    assert np.std(a.logits, axis=-1).min() > 0.1  # weights large enough that logits are not flat


# ------------------------------------------------------------------------ 1. Cell vs NumPy fp64

def test_full_sequence_matches_reference(parity_model):
    name, cfg, model, state = parity_model
    toks = tokens_for(cfg, 11, SEQ)
    logits, aux = full_forward_cell(model, toks)
    ref = reference_forward(cfg, state, toks)
    assert logits.dtype == np.float32 and aux.shape == (SEQ, 3 * cfg.hidden_size)
    assert_close(logits, ref.logits, what=f"{name} logits")
    assert_close(aux, ref.aux, what=f"{name} aux")
    # aux blocks are the hidden states ENTERING layers aux_layer_ids, in order (layer 0 input = embedding)
    if cfg.aux_layer_ids[0] == 0:
        emb = state["model.embed_tokens.weight"][toks]
        np.testing.assert_allclose(aux[:, : cfg.hidden_size], emb, rtol=0, atol=0)


def test_tree_positions_and_mask_match_reference(parity_model):
    """Positions differ from slots and the mask is a tree: the Cell must use each index space as given."""
    name, cfg, model, state = parity_model
    # tree over SEQ nodes: parent[k] < k; position = 3 + depth; node k sees its ancestors-or-self
    parent = [0, 0, 1, 1, 2, 0, 5, 3, 7, 6, 4, 9]
    depth = [0] * SEQ
    allowed = np.eye(SEQ, dtype=bool)
    for k in range(1, SEQ):
        depth[k] = depth[parent[k]] + 1
        allowed[k] |= allowed[parent[k]]
    positions = 3 + np.array(depth)
    slots = np.arange(SEQ)[::-1] + 5  # scattered, reversed slots: the mask is over slots, not rows
    allowed_slots = np.zeros((SEQ, model.capacity), bool)
    for k in range(SEQ):
        allowed_slots[k, slots[allowed[k]]] = True
    toks = tokens_for(cfg, 12, SEQ)
    logits, aux = run_cell(model, toks[None], positions[None], slots[None], allowed_slots[None])
    ref = reference_forward(cfg, state, toks, positions=positions, allowed=allowed)
    assert_close(logits[0], ref.logits, what=f"{name} tree logits")
    assert_close(aux[0], ref.aux, what=f"{name} tree aux")


def test_batch_two_rows_are_independent():
    cfg = GQA_BIAS_UNTIED
    model, state = build(cfg, seed=5, batch=2)
    toks = np.stack([tokens_for(cfg, 20, 8), tokens_for(cfg, 21, 8)])
    positions = np.stack([np.arange(8), np.arange(8) + 4])
    slots = np.stack([np.arange(8), np.arange(8) + 10])
    allowed = np.stack([causal_chunk_mask(0, 8, CAPACITY), causal_chunk_mask(10, 8, CAPACITY)])
    allowed[1, :, :10] = False  # row 1 has no committed prefix: it sees only its own slots 10..17
    logits, aux = run_cell(model, toks, positions, slots, allowed)
    for b in range(2):
        ref = reference_forward(cfg, state, toks[b], positions=positions[b])
        assert_close(logits[b], ref.logits, what=f"batch row {b} logits")
        assert_close(aux[b], ref.aux, what=f"batch row {b} aux")


# ------------------------------------------------------------------------ 2. incremental == full

def test_chunked_prefill_and_decode_equal_full_forward(runner_model):
    model, state = runner_model
    cfg = model.config
    seq = tokens_for(cfg, 30, 16)
    prompt, cont = seq[:11], seq[11:]
    runner = TeacherRunner(model, prefill_chunk=4, commit_width=4)  # chunks 4, 4, 3 (+1 pad)
    pre = runner.prefill(prompt)
    assert runner.length == 11 and pre.logits.shape == (11, cfg.vocab_size)
    dec = runner.decode_chain(cont)
    assert runner.length == 16
    inc_logits = np.concatenate([pre.logits, dec.logits])
    inc_aux = np.concatenate([pre.aux, dec.aux])

    ref = reference_forward(cfg, state, seq)
    for t in range(seq.size):  # every position, incl. chunk boundaries 3|4, 7|8 and prefill|decode 10|11
        assert_close(inc_logits[t], ref.logits[t], what=f"incremental logits @ {t}")
        assert_close(inc_aux[t], ref.aux[t], what=f"incremental aux @ {t}")
    np.testing.assert_array_equal(np.concatenate([pre.argmax, dec.argmax]), ref.logits.argmax(-1))

    # and against the Cell itself in one call (same fp32 arithmetic, different shapes/paths)
    one_logits, one_aux = full_forward_cell(model, seq)
    assert_close(inc_logits, one_logits, tol=1e-5, what="incremental vs one-call Cell logits")
    assert_close(inc_aux, one_aux, tol=1e-5, what="incremental vs one-call Cell aux")


def test_prefill_pad_slot_is_overwritten_by_decode(runner_model):
    """The last prefill chunk writes a pad token at slot 11; the decode of the next token must replace it."""
    model, state = runner_model
    seq = tokens_for(model.config, 31, 13)
    runner = TeacherRunner(model, prefill_chunk=4, commit_width=4)
    runner.prefill(seq[:11])
    padded_k = runner.cache_rows(11, 12)
    runner.decode_chain(seq[11:])
    ref = reference_forward(model.config, state, seq)
    out_k = runner.cache_rows(11, 12)
    assert any(not np.allclose(a, b) for a, b in zip(padded_k, out_k))
    runner.reset()
    pre = runner.prefill(seq)  # 13 tokens: chunks 4,4,4,1 (+3 pad)
    assert_close(pre.logits, ref.logits, what="prefill 13 tokens")


def test_rope_equals_rotate_half_reference():
    """Rotary (signed sin) + apply_rope (half swap) == x*cos + [-x2, x1]*sin in float64, exactly up to
    fp32 rounding of the same products; the half swap and the sign pattern by hand."""
    assert half_swap_index(4).tolist() == [2, 3, 0, 1]
    four = Tensor(half_swap_index(4))
    assert swap_halves(Tensor(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)), four).asnumpy().tolist() == [[3, 4, 1, 2]]
    d, theta = 8, 10000.0
    positions = np.array([[0, 3, 17]], np.int32)
    cos, sin = Rotary(d, theta)(Tensor(positions))  # [1, 1, 3, D]
    angles = positions[0, :, None].astype(np.float64) * rope_inv_freq(d, theta)[None].astype(np.float64)
    np.testing.assert_allclose(sin.asnumpy()[0, 0], np.concatenate([-np.sin(angles), np.sin(angles)], -1),
                               rtol=1e-6, atol=1e-6)
    x = np.random.default_rng(3).standard_normal((1, 2, 3, d)).astype(np.float32)  # [B, H, N, D]
    got = apply_rope(Tensor(x), cos, sin, Tensor(half_swap_index(d))).asnumpy()
    xd, half = x.astype(np.float64), d // 2
    c = np.cos(np.concatenate([angles, angles], -1))
    s_ = np.sin(np.concatenate([angles, angles], -1))
    want = xd * c + np.concatenate([-xd[..., half:], xd[..., :half]], -1) * s_
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_float16_teacher_matches_float32():
    """compute_dtype float16 runs prefill + decode through the cache and stays close to float32."""
    cfg16 = dataclasses.replace(GQA_BIAS_UNTIED, compute_dtype="float16")
    m32, state = build(GQA_BIAS_UNTIED, seed=9, capacity=16)
    m16 = PanguForCausalLM(cfg16, 1, 16)
    load_state(m16, state)
    seq = tokens_for(GQA_BIAS_UNTIED, 31, 9)
    outs = []
    for model in (m32, m16):
        runner = TeacherRunner(model, prefill_chunk=4, commit_width=4)
        pre, dec = runner.prefill(seq[:6]), runner.decode_chain(seq[6:])
        outs.append(np.concatenate([pre.logits, dec.logits]))
    assert outs[1].dtype == np.float32
    assert_close(outs[1], outs[0], tol=2e-2, what="float16 vs float32 logits")


# ------------------------------------------------------------------------ 3. GRAPH_MODE == PyNative

def test_graph_mode_equals_pynative():
    cfg = MHA_NOBIAS_TIED
    toks = tokens_for(cfg, 40, 7)
    outs = {}
    try:
        for mode in (ms.PYNATIVE_MODE, ms.GRAPH_MODE):
            ms.set_context(mode=mode)
            model, state = build(cfg, seed=2, capacity=16)  # fresh model per mode
            outs[mode] = full_forward_cell(model, toks)
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
    for i, what in enumerate(("logits", "aux")):
        assert_close(outs[ms.PYNATIVE_MODE][i], outs[ms.GRAPH_MODE][i], tol=1e-5, what=f"pynative vs graph {what}")
    assert_close(outs[ms.GRAPH_MODE][0], reference_forward(cfg, state, toks).logits, what="graph vs reference")


# ------------------------------------------------------------------------ 4. no recompilation

def test_new_values_do_not_recompile(runner_model):
    model, _ = runner_model
    cap = model.capacity
    rng = np.random.default_rng(50)

    def call(n, seed_offset):
        ids = rng.integers(0, model.config.vocab_size, size=(1, n))
        start = int(rng.integers(0, cap - n))
        slots = (np.arange(n) + start)[None]
        positions = (np.arange(n) + seed_offset)[None]
        run_cell(model, ids, positions, slots, causal_chunk_mask(start, n, cap)[None])

    call(4, 0)  # N=4 (the prefill chunk of the other tests): compiled once here or earlier
    base = len(model.compile_cache)
    for k in range(1, 4):
        call(4, 7 * k)
    assert len(model.compile_cache) == base, "new values of a compiled shape recompiled"
    call(5, 0)
    assert len(model.compile_cache) == base + 1, "one new N must add exactly one graph"
    call(5, 9)
    call(4, 2)
    assert len(model.compile_cache) == base + 1, "returning to a compiled N recompiled"


def test_runner_steady_state_does_not_recompile(runner_model):
    model, _ = runner_model
    runner = TeacherRunner(model, prefill_chunk=4, commit_width=4)
    runner.prefill(tokens_for(model.config, 60, 6))
    runner.decode_chain(tokens_for(model.config, 61, 2))
    base = len(model.compile_cache)
    runner.prefill(tokens_for(model.config, 62, 10))  # another prompt length, same chunk
    runner.decode_chain(tokens_for(model.config, 63, 3))
    assert len(model.compile_cache) == base


# ------------------------------------------------------------------------ 5. prompt-fit errors

def test_prompt_too_long_raises_clear_error(runner_model):
    model, _ = runner_model  # capacity 32
    runner = TeacherRunner(model, prefill_chunk=5, commit_width=4)
    runner.check_prompt_fits(30)  # padded 30, +1 decode slot = 31: fits
    by_four = TeacherRunner(model, prefill_chunk=4, commit_width=4)
    by_four.check_prompt_fits(31)  # padded 32, +1 decode slot = 32: fits exactly
    with pytest.raises(ValueError, match=r"prompt of 32 tokens does not fit the KV cache.*33 slots.*is 32"):
        by_four.check_prompt_fits(32)  # padding fits, the first decode slot does not
    with pytest.raises(ValueError, match=r"prompt of 31 tokens.*35 slots.*prefill_chunk 5"):
        runner.check_prompt_fits(31)  # 31 + 1 fits, but chunk padding needs 35 slots
    compiled, length = len(model.compile_cache), runner.length
    with pytest.raises(ValueError, match="does not fit"):
        runner.prefill(np.arange(40) % model.config.vocab_size)
    assert len(model.compile_cache) == compiled and runner.length == length  # refused before any call


def test_a_checked_prompt_is_checked_once(runner_model, monkeypatch):
    """check_prompt's array is prefilled without a second check (Session.generate: check, compile, prefill);
    any other array, equal or not, is checked by prefill."""
    import eagle_ms.teacher as teacher

    checks, real = [], teacher.check_token_ids
    monkeypatch.setattr(teacher, "check_token_ids", lambda ids, vocab, what="prompt": checks.append(what) or
                        real(ids, vocab, what))
    model, state = runner_model
    runner = TeacherRunner(model, prefill_chunk=4, commit_width=4)
    raw = tokens_for(model.config, 80, 9)
    checked = runner.check_prompt(raw)
    assert checks == ["prompt"] and checked.dtype == np.int32 and not checked.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        checked[0] = 1
    pre = runner.prefill(checked)
    assert checks == ["prompt"]
    np.testing.assert_array_equal(pre.argmax, reference_forward(model.config, state, raw).logits.argmax(-1))
    runner.prefill(raw)
    runner.prefill(checked.copy())
    assert checks == ["prompt"] * 3
    bad = checked.copy()
    bad[2] = model.config.vocab_size
    with pytest.raises(ValueError, match="position 2"):
        runner.prefill(bad)


def test_empty_prompt_raises(runner_model):
    runner = TeacherRunner(runner_model[0], prefill_chunk=4, commit_width=4)
    with pytest.raises(ValueError, match="empty"):
        runner.prefill(np.zeros(0, np.int32))
    with pytest.raises(ValueError, match="empty"):
        runner.check_prompt_fits(0)


def test_decode_past_capacity_raises(runner_model):
    model, _ = runner_model
    runner = TeacherRunner(model, prefill_chunk=4, commit_width=4)
    runner.prefill(tokens_for(model.config, 70, 30))
    runner.decode_chain([5, 6])  # slots 30, 31: exactly full
    with pytest.raises(ValueError, match="KV cache full"):
        runner.decode_chain([7])


# ------------------------------------------------------------------------ 6. aux layer ids (config only)

def _cfg(layers, **kw):
    return ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                       num_attention_heads=2, num_key_value_heads=1, **kw)


@pytest.mark.parametrize("layers, expected", [
    (7, (2, 3, 4)), (8, (2, 4, 5)), (12, (2, 6, 9)), (32, (2, 16, 29)),  # default (2, L//2, L-3)
    (3, (0, 1, 2)), (4, (0, 2, 3)), (5, (0, 2, 4)), (6, (0, 3, 5)),  # fallback (0, L//2, L-1)
])
def test_default_aux_layer_ids(layers, expected):
    assert _cfg(layers).aux_layer_ids == expected


def test_too_few_layers_for_aux_raises():
    with pytest.raises(ValueError, match="num_hidden_layers"):
        _cfg(2)


@pytest.mark.parametrize("ids", [
    (0, 1), (0, 1, 2, 3), (0, 1, 8), (-1, 1, 2), (3, 2, 1), (1, 1, 2), (0, 1.0, 2), ("0", 1, 2),
])
def test_bad_aux_layer_ids_raise(ids):
    with pytest.raises(ValueError, match=r"model\.model_config\.aux_layer_ids"):
        _cfg(8, aux_layer_ids=ids)


@pytest.mark.parametrize("ids", [5, (True, 2, 3)])
def test_non_sequence_or_bool_aux_layer_ids_raise_value_error(ids):
    with pytest.raises(ValueError, match=r"model\.model_config\.aux_layer_ids"):
        _cfg(8, aux_layer_ids=ids)


def test_explicit_aux_layer_ids_kept_and_used():
    cfg = _cfg(8, aux_layer_ids=[1, 4, 6])
    assert cfg.aux_layer_ids == (1, 4, 6)
    assert _cfg(3, aux_layer_ids=(0, 1, 2)).aux_layer_ids == (0, 1, 2)
