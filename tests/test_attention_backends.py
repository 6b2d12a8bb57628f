"""Attention backends: the fused (Ascend FlashAttentionScore) wiring, tested on CPU, and backend choice.

``mindspore.ops.flash_attention_score`` only runs on Ascend. Here a NumPy emulation of its documented
semantics is patched in its place (as ``eagle_ms.models.attention`` sees it), and the FusedAttention cell is
run in PyNative mode (the emulation is host code, it cannot be compiled into a graph):

    out[b, h] = softmax(scalar_value * q[b, h] @ k[b, h // (N1 / N2)]^T, discarding where mask == 1) @ v[...]
    layout BNSD (q [B, N1, S1, D], k/v [B, N2, S2, D]), head_num == N1, N2 divides N1,
    attn_mask bool/uint8 of shape [B, N1, S1, S2], [B, 1, S1, S2] or [S1, S2] with 1/True = DISCARD,
    sparse_mode 0, output [B, N1, S1, D] in q's dtype.

The emulation itself is pinned by hand-computed literals; then FusedAttention == EagerAttention on random
inputs and tree masks, the mask handed to the op is uint8 [B, 1, N, S] with 1 = discard, and a whole
teacher built with backend='fused' gives the eager teacher's logits for prefill, decode and a tree verify.
"""
import math

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

import eagle_ms.models.attention as attention
from eagle_ms.models.attention import (ENV_DISABLE_FUSED_TREE, ENV_FORCE_EAGER, NEG_INF, EagerAttention,
                                FusedAttention, choose_backend, make_attention)
from eagle_ms.tree import tensorize, verify_attention_mask
from helpers_models import TINY, build_teacher, make_runner, make_tree, prompt, random_parents, rel_err

MS_TO_NP = {ms.float32: np.float32, ms.float16: np.float16}


# ------------------------------------------------------------------------------ the emulation

def flash_attention_score_np(query, key, value, head_num, attn_mask=None, scalar_value=1.0,
                             input_layout="BSH", sparse_mode=0, keep_prob=1.0, strict_dtype=False):
    """Documented FlashAttentionScore (BNSD, sparse_mode 0, no dropout / pse) on NumPy arrays."""
    if input_layout != "BNSD" or sparse_mode != 0 or keep_prob != 1.0:
        raise NotImplementedError(f"emulated: BNSD, sparse_mode 0, keep_prob 1; got {input_layout}, "
                                  f"{sparse_mode}, {keep_prob}")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query/key/value dtypes differ: {query.dtype} {key.dtype} {value.dtype}")
    if strict_dtype and query.dtype != np.float16:  # the op accepts float16 / bfloat16 only
        raise TypeError(f"flash_attention_score: query dtype {query.dtype} is not float16 or bfloat16")
    if not isinstance(scalar_value, float):
        raise TypeError(f"scalar_value must be a float (double), got {type(scalar_value)}")
    b, n1, s1, d = query.shape
    _, n2, s2, d2 = key.shape
    if head_num != n1 or head_num <= 0 or n1 % n2 or d2 != d or value.shape != key.shape or key.shape[0] != b:
        raise RuntimeError(f"bad shapes: q {query.shape} k {key.shape} v {value.shape} head_num {head_num}")
    discard = np.zeros((b, n1, s1, s2), bool)
    if attn_mask is not None:
        if attn_mask.dtype not in (np.uint8, np.bool_):
            raise TypeError(f"attn_mask dtype {attn_mask.dtype} is not bool or uint8")
        if attn_mask.shape not in ((b, n1, s1, s2), (b, 1, s1, s2), (s1, s2)):
            raise RuntimeError(f"attn_mask shape {attn_mask.shape} is not valid")
        discard = np.broadcast_to(attn_mask.astype(bool), (b, n1, s1, s2))
    kv = np.arange(n1) // (n1 // n2)  # query head h reads kv head h // group
    q, k, v = (x.astype(np.float64) for x in (query, key[:, kv], value[:, kv]))
    scores = scalar_value * q @ k.swapaxes(-1, -2)  # [B, N1, S1, S2]
    scores = np.where(discard, -np.inf, scores)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    return (probs @ v).astype(query.dtype)  # [B, N1, S1, D]


class FakeFlash:
    """Stands in for ops.flash_attention_score: Tensor in/out around the emulation; records calls."""

    def __init__(self, strict_dtype=False):
        self.calls = []
        self.strict_dtype = strict_dtype

    def __call__(self, query, key, value, head_num, real_shift=None, drop_mask=None, padding_mask=None,
                 attn_mask=None, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, keep_prob=1.0,
                 scalar_value=1.0, pre_tokens=2147483647, next_tokens=2147483647, inner_precise=0,
                 input_layout="BSH", sparse_mode=0):
        assert real_shift is None and drop_mask is None and padding_mask is None and prefix is None
        assert actual_seq_qlen is None and actual_seq_kvlen is None
        mask = None if attn_mask is None else attn_mask.asnumpy()
        self.calls.append(dict(q_shape=tuple(query.shape), k_shape=tuple(key.shape), dtype=query.dtype,
                               head_num=head_num, mask=mask, mask_dtype=None if attn_mask is None else attn_mask.dtype,
                               scalar_value=scalar_value, input_layout=input_layout, sparse_mode=sparse_mode))
        out = flash_attention_score_np(query.asnumpy(), key.asnumpy(), value.asnumpy(), head_num, mask,
                                       scalar_value, input_layout, sparse_mode, keep_prob, self.strict_dtype)
        return Tensor(out)


@pytest.fixture
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)


@pytest.fixture
def fake_flash(monkeypatch):
    fake = FakeFlash()
    monkeypatch.setattr(attention.ops, "flash_attention_score", fake)
    return fake


def test_emulation_literals():
    """Hand-computed: 1 = discard; scalar_value scales scores; GQA head h reads kv head h // group."""
    # B=1, N1=4, N2=2, S1=1, S2=2, D=2. kv head 0 values [[1,0],[0,1]], kv head 1 values [[5,5],[7,9]]
    q = np.ones((1, 4, 1, 2), np.float32)
    k = np.array([[[[1, 0], [0, 0]], [[0, 0], [0, 0]]]], np.float32)
    v = np.array([[[[1, 0], [0, 1]], [[5, 5], [7, 9]]]], np.float32)
    keep_both = np.zeros((1, 1, 1, 2), np.uint8)
    out = flash_attention_score_np(q, k, v, 4, keep_both, 1.0, "BNSD")
    w = 1 / (1 + math.exp(-1))  # kv head 0: scores [1, 0] -> softmax [w, 1-w]
    np.testing.assert_allclose(out[0, :2, 0], [[w, 1 - w]] * 2, rtol=1e-6)
    np.testing.assert_allclose(out[0, 2:, 0], [[6, 7]] * 2, rtol=1e-6)  # kv head 1: equal scores -> mean
    w2 = 1 / (1 + math.exp(-2))  # scalar_value 2 doubles the score gap
    np.testing.assert_allclose(flash_attention_score_np(q, k, v, 4, keep_both, 2.0, "BNSD")[0, 0, 0],
                               [w2, 1 - w2], rtol=1e-6)
    drop_first = np.array([[[[1, 0]]]], np.uint8)  # 1 = discard slot 0: only slot 1 remains
    out = flash_attention_score_np(q, k, v, 4, drop_first, 1.0, "BNSD")
    np.testing.assert_allclose(out[0, :, 0], [[0, 1], [0, 1], [7, 9], [7, 9]], rtol=1e-6)
    np.testing.assert_array_equal(flash_attention_score_np(q, k, v, 4, drop_first.astype(bool), 1.0, "BNSD"), out)
    with pytest.raises(RuntimeError):
        flash_attention_score_np(q, k, v, 4, np.zeros((1, 1, 2, 2), np.uint8), 1.0, "BNSD")
    with pytest.raises(TypeError):
        flash_attention_score_np(q, k, v, 4, np.zeros((1, 1, 1, 2), np.float32), 1.0, "BNSD")
    with pytest.raises(RuntimeError):
        flash_attention_score_np(q, k[:, :1].repeat(3, 1), v[:, :1].repeat(3, 1), 4, None, 1.0, "BNSD")


# ------------------------------------------------------------------------------ cell level

def _tree_allowed(seed, budget, committed, capacity):
    rng = np.random.default_rng(seed)
    parents = random_parents(int(rng.integers(1, budget + 1)), rng, 5)
    t = tensorize(make_tree(3, rng.integers(0, 50, len(parents)), parents), committed, budget, 6)
    return verify_attention_mask(t, capacity)  # [N, capacity] bool


def _run_cells(hq, hkv, d, batch, dtype, seed):
    rng = np.random.default_rng(seed)
    budget, capacity = 7, 24
    n = budget + 1
    allowed = np.stack([_tree_allowed(seed + i, budget, 5 + 3 * i, capacity) for i in range(batch)])
    q = rng.standard_normal((batch, hq, n, d)).astype(MS_TO_NP[dtype])
    k = rng.standard_normal((batch, hkv, capacity, d)).astype(MS_TO_NP[dtype])
    v = rng.standard_normal((batch, hkv, capacity, d)).astype(MS_TO_NP[dtype])
    fused, eager = FusedAttention(hq, hkv, d), EagerAttention(hq, hkv, d)
    ins = [Tensor(x) for x in (q, k, v)]
    out_f = fused(*ins, fused.prepare_mask(Tensor(allowed))).asnumpy()
    out_e = eager(*ins, eager.prepare_mask(Tensor(allowed))).asnumpy()
    return allowed, (q, k, v), out_f, out_e


@pytest.mark.parametrize("hq, hkv, d, batch", [(4, 2, 8, 1), (4, 4, 16, 1), (4, 1, 8, 2), (6, 3, 16, 2)])
def test_fused_cell_equals_eager_cell(pynative, fake_flash, hq, hkv, d, batch):
    allowed, (q, k, v), out_f, out_e = _run_cells(hq, hkv, d, batch, ms.float32, seed=hq * 10 + hkv)
    n, s = allowed.shape[1:]
    assert out_f.shape == out_e.shape == (batch, n, hq * d)
    # fp32 inputs reach the op as fp16 (the op accepts only fp16/bf16), so compare at fp16 precision
    assert out_f.dtype == np.float32
    assert rel_err(out_f, out_e) < 3e-3
    # and both equal the emulation applied directly to the bool "discard" mask
    ref = flash_attention_score_np(q, k, v, hq, ~allowed[:, None], 1 / math.sqrt(d), "BNSD")
    assert rel_err(out_e, ref.swapaxes(1, 2).reshape(batch, n, hq * d)) < 1e-5
    # what the op was handed
    (call,) = fake_flash.calls
    assert call["mask_dtype"] == ms.uint8
    assert call["mask"].shape == (batch, 1, n, s)
    np.testing.assert_array_equal(call["mask"], (~allowed[:, None]).astype(np.uint8))  # 1 = discard
    assert call["head_num"] == hq and call["input_layout"] == "BNSD" and call["sparse_mode"] == 0
    assert call["dtype"] == ms.float16
    assert call["q_shape"] == (batch, hq, n, d) and call["k_shape"] == (batch, hkv, s, d)
    assert call["scalar_value"] == pytest.approx(1 / math.sqrt(d))


def test_fused_cell_float16_under_strict_dtype(pynative, monkeypatch):
    """A float16 model hands the op float16 (the dtype Ascend requires) and matches eager float16."""
    fake = FakeFlash(strict_dtype=True)
    monkeypatch.setattr(attention.ops, "flash_attention_score", fake)
    _, _, out_f, out_e = _run_cells(4, 2, 16, 1, ms.float16, seed=3)
    assert out_f.dtype == np.float16 and fake.calls[0]["dtype"] == ms.float16
    assert rel_err(out_f.astype(np.float32), out_e.astype(np.float32)) < 1e-2


def test_prepare_mask_conventions(pynative):
    allowed = np.array([[[True, False, True], [False, True, True]]])  # [B=1, N=2, S=3]
    fused = FusedAttention(2, 1, 8).prepare_mask(Tensor(allowed))
    assert fused.dtype == ms.uint8 and fused.shape == (1, 1, 2, 3)
    np.testing.assert_array_equal(fused.asnumpy()[0, 0], [[0, 1, 0], [1, 0, 0]])
    eager = EagerAttention(2, 1, 8).prepare_mask(Tensor(allowed)).asnumpy()
    assert eager.dtype == np.float32 and eager.shape == (1, 1, 1, 2, 3)
    np.testing.assert_array_equal(eager[0, 0, 0], np.where(allowed[0], 0.0, np.float32(NEG_INF)))


# ------------------------------------------------------------------------------ whole teacher

def test_fused_teacher_equals_eager_teacher(pynative, fake_flash):
    """Same weights, backend 'fused' (emulated op) vs 'eager': prefill, tree verify, decode."""
    capacity, budget = 32, 8
    eager_model, state = build_teacher(capacity, "eager", seed=41)
    fused_model, _ = build_teacher(capacity, "fused", state=state)
    outs = {}
    for backend, model in (("eager", eager_model), ("fused", fused_model)):
        runner = make_runner(model, prefill_chunk=8, max_depth=4)
        pre = runner.prefill(prompt(4, 11))
        parents = random_parents(budget, np.random.default_rng(2), 4)
        t = tensorize(make_tree(int(pre.argmax[-1]), np.arange(budget) * 7 % TINY.vocab_size, parents),
                      runner.length, budget, 4)
        ver = runner.verify(t)
        dec = runner.decode_chain(np.array([int(pre.argmax[-1]), 5]))
        outs[backend] = (pre, ver, dec)
    assert len(fake_flash.calls) == TINY.num_hidden_layers * (2 + 1 + 2)  # 2 prefill chunks, verify, 2 decodes
    assert all(c["mask_dtype"] == ms.uint8 for c in fake_flash.calls)
    verify_call = fake_flash.calls[2 * TINY.num_hidden_layers]
    assert verify_call["mask"].shape == (1, 1, budget + 1, capacity)
    np.testing.assert_array_equal(verify_call["mask"][0, 0], ~verify_attention_mask(t, capacity))
    for (e, f), what in zip(zip(outs["eager"], outs["fused"]), ("prefill", "verify", "decode")):
        assert rel_err(f.logits, e.logits) < 5e-3, what  # fused path runs the op in fp16
        assert rel_err(f.aux, e.aux) < 5e-3, what
        np.testing.assert_array_equal(f.argmax, e.argmax)


# ------------------------------------------------------------------------------ backend choice

@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(ENV_FORCE_EAGER, raising=False)
    monkeypatch.delenv(ENV_DISABLE_FUSED_TREE, raising=False)
    return monkeypatch


@pytest.mark.parametrize("mode, device, tree, want", [
    ("reference", "Ascend", False, "eager"), ("reference", "Ascend", True, "eager"),
    ("performance", "Ascend", False, "fused"), ("performance", "Ascend", True, "fused"),
    ("performance", "CPU", False, "eager"), ("performance", "CPU", True, "eager"),
    ("performance", "GPU", True, "eager"), ("reference", "CPU", False, "eager"),
])
def test_choose_backend_defaults(clean_env, mode, device, tree, want):
    assert choose_backend(mode, device, tree) == want


def test_env_force_eager(clean_env):
    clean_env.setenv(ENV_FORCE_EAGER, "1")
    for tree in (False, True):
        assert choose_backend("performance", "Ascend", tree) == "eager"
    clean_env.setenv(ENV_FORCE_EAGER, "0")
    assert choose_backend("performance", "Ascend", True) == "fused"


def test_env_disable_fused_tree(clean_env):
    clean_env.setenv(ENV_DISABLE_FUSED_TREE, "1")
    assert choose_backend("performance", "Ascend", tree=True) == "eager"
    assert choose_backend("performance", "Ascend", tree=False) == "fused"  # decode-only graphs keep it
    assert choose_backend("reference", "Ascend", tree=False) == "eager"
    clean_env.setenv(ENV_DISABLE_FUSED_TREE, "0")
    assert choose_backend("performance", "Ascend", tree=True) == "fused"


def test_env_names_are_documented_constants():
    assert ENV_FORCE_EAGER == "EAGLE_MS_FORCE_EAGER_ATTN"
    assert ENV_DISABLE_FUSED_TREE == "EAGLE_MS_DISABLE_FUSED_TREE"


def test_make_attention_names_bad_backend():
    assert isinstance(make_attention("eager", 4, 2, 8), EagerAttention)
    assert isinstance(make_attention("fused", 4, 2, 8), FusedAttention)
    with pytest.raises(ValueError, match="'flash'"):
        make_attention("flash", 4, 2, 8)
