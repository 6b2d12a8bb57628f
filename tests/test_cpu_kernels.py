"""The fused CPU kernels (eagle_ms/models/cpu_kernels.cc) against NumPy float64 references written here.

Covers each kernel through a compiled MindSpore graph (RmsNorm, EmbedPairNorm, AddRmsNorm,
SiluMul over extreme inputs, RopeSplit with a position per row and one shared position, with and without
bias, MaskedSoftmax with grouped query rows and masked slots that must come out exactly 0, WindowAttention
over a cache window in place, row by row, LogSoftmaxTopK with ties); a teacher built
with the kernels decoding incrementally == its own full forward == the NumPy teacher; the choice rules
(``choose_kernels``, ``runtime.kernels``) and the build errors. The model-level parity with the kernels is
in tests/test_pangu_model.py and tests/test_eagle3_model.py.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

from eagle_ms.config import RuntimeConfig
from eagle_ms.models import cpu_kernels
from eagle_ms.teacher import TeacherRunner
from numpy_reference import reference_forward
from test_pangu_model import GQA_BIAS_UNTIED, assert_close, build, tokens_for

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

RNG = np.random.default_rng(0)


class Call(nn.Cell):
    """One kernel as a graph: construct(*inputs) -> the operator's outputs."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def construct(self, *inputs):
        return self.op(*inputs)


def run(op, *arrays):
    out = Call(op)(*[Tensor(np.asarray(a, np.float32)) for a in arrays])
    return [o.asnumpy() for o in out] if isinstance(out, tuple) else out.asnumpy()


def np_rms(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def close(actual, expected, rtol=2e-6):
    scale = max(np.max(np.abs(expected)), 1e-30)
    err = np.max(np.abs(actual.astype(np.float64) - expected)) / scale
    assert err < rtol, f"relative error {err:.3e}"


def test_rms_norm():
    x = RNG.standard_normal((2, 5, 3, 40)) * 3
    w1 = 1 + RNG.standard_normal(40) * 0.3
    close(run(cpu_kernels.rms_norm_op(), x, w1, [1e-5]), np_rms(x, w1, 1e-5))


def test_embed_pair_norm_looks_up_and_norms_both_halves():
    """[RmsNorm(table[id]) with w_embed, RmsNorm(feature) with w_feature] per row (NumPy float64); an id
    outside the table is an error, not a read past it."""
    table, feature = RNG.standard_normal((30, 24)) * 2, RNG.standard_normal((2, 3, 24))
    w1, w2 = 1 + RNG.standard_normal(24) * 0.3, 1 + RNG.standard_normal(24) * 0.3
    ids = np.array([[0, 29, 7], [7, 3, 3]], np.int32)
    op = cpu_kernels.embed_pair_norm_op()

    def call(token_ids):
        floats = [Tensor(np.asarray(a, np.float32)) for a in (feature, w1, w2, [1e-5])]
        return Call(op)(Tensor(table.astype(np.float32)), Tensor(token_ids), *floats).asnumpy()

    want = np.concatenate([np_rms(table[ids], w1, 1e-5), np_rms(feature, w2, 1e-5)], -1)
    close(call(ids), want)
    with pytest.raises(RuntimeError, match="is 3"):
        call(np.array([[0, 30, 1], [1, 1, 1]], np.int32))


def test_add_rms_norm():
    x, a = RNG.standard_normal((1, 7, 33)), RNG.standard_normal((1, 7, 33))
    bias, w = RNG.standard_normal(33), 1 + RNG.standard_normal(33) * 0.3
    s, y = run(cpu_kernels.add_rms_norm_op(), x, a, bias, w, [1e-5])
    want = x + (a + bias)
    close(s, want)
    close(y, np_rms(want, w, 1e-5))


def test_silu_mul_over_the_whole_range():
    gate = np.concatenate([RNG.standard_normal(90) * 4, [-1e4, -200.0, -89.0, -87.5, -20.0, 0.0, 20.0, 88.0, 200.0, 1e4]])
    up = RNG.standard_normal(100)
    gate_up = np.concatenate([gate, up]).reshape(1, 1, 200)
    got = run(cpu_kernels.silu_mul_op(), gate_up)[0, 0]
    gate, up = gate.astype(np.float32).astype(np.float64), up.astype(np.float32).astype(np.float64)
    with np.errstate(over="ignore"):
        want = gate / (1 + np.exp(-gate)) * up  # float64; exp(1e4) = inf gives the limit -0
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("shared_position", [False, True])
def test_rope_split(shared_position):
    b, n, hq, hkv, d = 2, 5, 4, 2, 8
    qkv = RNG.standard_normal((b, n, hq + 2 * hkv, d)).astype(np.float32)
    bias = RNG.standard_normal((hq + 2 * hkv) * d).astype(np.float32)
    positions = np.full((b, 1), 9) if shared_position else RNG.integers(0, 50, (b, n))
    angles = positions[..., None] * 10000.0 ** (-np.arange(0, d, 2) / d)
    cos = np.cos(np.concatenate([angles, angles], -1))
    sin = np.sin(np.concatenate([angles, angles], -1))
    signed = np.concatenate([-sin[..., : d // 2], sin[..., d // 2:]], -1)  # layers.Rotary's sin
    q, k, v = run(cpu_kernels.rope_split_op(hq, hkv), qkv, bias, cos, signed)

    x = qkv + bias.reshape(hq + 2 * hkv, d)  # float32, as the kernel adds it
    table = (lambda t: t[:, :, None, :]) if not shared_position else (lambda t: t[:, :1, None, :])
    x64 = x.astype(np.float64)
    rotate_half = np.concatenate([-x64[..., d // 2:], x64[..., : d // 2]], -1)
    rotated = x64 * table(cos) + rotate_half * table(sin)
    close(q, rotated[:, :, :hq].transpose(0, 2, 1, 3))
    close(k, rotated[:, :, hq:hq + hkv])
    np.testing.assert_array_equal(v, x[:, :, hq + hkv:])


def test_masked_softmax_groups_and_masked_slots():
    b, hkv, g, n, s = 1, 2, 3, 4, 37
    scores = RNG.standard_normal((b, hkv, g * n, s)) * 5
    allowed = RNG.random((b, n, s)) < 0.6
    allowed[:, np.arange(n), np.arange(n)] = True  # every row keeps a slot
    mask = np.where(allowed, 0.0, -1e30).reshape(b, 1, 1, n, s)
    got = run(cpu_kernels.masked_softmax_op(), scores, mask, [0.125])
    logits = scores.reshape(b, hkv, g, n, s) * 0.125 + np.where(allowed, 0.0, -np.inf)[:, None, None]
    e = np.exp(logits - logits.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)).reshape(b, hkv, g * n, s)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9)
    dropped = np.broadcast_to(~allowed[:, None, None], (b, hkv, g, n, s)).reshape(b, hkv, g * n, s)
    assert np.all(got[dropped] == 0.0), "a masked slot must get exactly 0"


def np_window_attention(q, k_cache, v_cache, hkv, allowed, scale):
    """float64: q [B,Hq,N,D] over slots [0, W) of the flat caches [B*Hkv*S, D] -> [B, N, Hq*D]."""
    b, hq, n, d = q.shape
    w = allowed.shape[-1]

    def window(cache):  # [B*Hkv*S, D] -> [B, Hq, W, D]; query head h*G + g reads KV head h (HF repeat_kv)
        return cache.reshape(b, hkv, -1, d)[:, :, :w].astype(np.float64).repeat(hq // hkv, axis=1)

    keys, values = window(k_cache), window(v_cache)
    logits = np.einsum("bhnd,bhwd->bhnw", q.astype(np.float64), keys) * scale
    logits = np.where(allowed[:, None], logits, -np.inf)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    probs = e / e.sum(-1, keepdims=True)
    return np.einsum("bhnw,bhwd->bnhd", probs, values).reshape(b, n, hq * d)


def run_masked(op, q, k_cache, v_cache, keep, scales):
    """WindowAttention's call: the bool ``keep`` mask as is, every other input float32."""
    floats = [Tensor(np.asarray(a, np.float32)) for a in (q, k_cache, v_cache)]
    return Call(op)(*floats, Tensor(keep), Tensor(np.asarray(scales, np.float32))).asnumpy()


def test_window_attention_reads_the_cache_window_in_place():
    """GQA (G = 2), B = 2, a window W < S, random masks: == NumPy float64; a row's result does not depend on
    the other rows or on slots beyond the kept ones (bitwise: the same row alone, wider window)."""
    b, hq, hkv, n, d, s, w = 2, 4, 2, 5, 16, 24, 12
    q = RNG.standard_normal((b, hq, n, d)) * 2
    k_cache = RNG.standard_normal((b * hkv * s, d))
    v_cache = RNG.standard_normal((b * hkv * s, d))
    allowed = RNG.random((b, n, w)) < 0.5
    allowed[:, np.arange(n), np.arange(n)] = True  # every row keeps a slot
    scale = 1 / np.sqrt(d)
    op = cpu_kernels.window_attention_op()
    got = run_masked(op, q, k_cache, v_cache, allowed, [scale] * hkv)
    close(got, np_window_attention(q, k_cache, v_cache, hkv, allowed, scale))
    wider = np.concatenate([allowed, np.zeros((b, n, s - w), bool)], -1)  # same kept slots, window S
    alone = run_masked(op, q[:, :, 2:3], k_cache, v_cache, wider[:, 2:3], [scale] * hkv)
    np.testing.assert_array_equal(alone[:, 0], got[:, 2])


def test_log_softmax_top_k_with_ties_and_target_offsets():
    """Rows of [2, 3, V]: the top-K log-softmax values (NumPy float64), descending, equal logits in index order
    (a row of all-equal logits and a row with a tie across the K boundary), target ids index + d2t[index]."""
    v, k = 300, 4
    logits = RNG.standard_normal((2, 3, v)) * 4
    logits[0, 1] = 1.5                          # all equal: indices 0..K-1
    logits[1, 2, [7, 50, 120, 299]] = 30.0      # four-way tie at the top
    logits[1, 0, [3, 200]] = 30.0               # tie for the first place
    d2t = RNG.integers(0, 50, v).astype(np.int32)
    values, ids = Call(cpu_kernels.log_softmax_top_k_op(k))(Tensor(logits.astype(np.float32)), Tensor(d2t))
    x = logits.astype(np.float32).astype(np.float64)
    order = np.argsort(-x, axis=-1, kind="stable")[..., :k]  # stable: equal values keep index order
    log_probs = x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    np.testing.assert_allclose(values.asnumpy(), np.take_along_axis(log_probs, order, -1), rtol=1e-6, atol=2e-6)
    np.testing.assert_array_equal(ids.asnumpy(), order + d2t[order])
    np.testing.assert_array_equal(order[0, 1], np.arange(k))
    np.testing.assert_array_equal(order[1, 2], [7, 50, 120, 299])
    np.testing.assert_array_equal(order[1, 0, :2], [3, 200])


def test_teacher_with_kernels_decodes_like_its_full_forward_and_the_reference():
    model, state = build(GQA_BIAS_UNTIED, seed=7, capacity=32, kernels="cpu")
    seq = tokens_for(GQA_BIAS_UNTIED, 30, 16)
    runner = TeacherRunner(model, prefill_chunk=4, commit_width=4)
    pre = runner.prefill(seq[:11])
    dec = runner.decode_chain(seq[11:])
    logits = np.concatenate([pre.logits, dec.logits])
    ref = reference_forward(GQA_BIAS_UNTIED, state, seq)
    assert_close(logits, ref.logits, what="incremental logits with the cpu kernels")
    np.testing.assert_array_equal(logits.argmax(-1), ref.logits.argmax(-1))


@pytest.mark.parametrize("setting, device, dtype, want", [
    ("auto", "CPU", "float32", "cpu"),
    ("auto", "Ascend", "float32", "composite"),
    ("auto", "CPU", "float16", "composite"),
    ("composite", "CPU", "float32", "composite"),
    ("cpu", "CPU", "float32", "cpu"),
])
def test_choose_kernels(setting, device, dtype, want):
    assert cpu_kernels.choose_kernels(setting, device, dtype) == want


def test_kernels_cpu_where_it_cannot_run_is_refused():
    with pytest.raises(ValueError, match="runtime.kernels.*float32"):
        cpu_kernels.choose_kernels("cpu", "CPU", "float16")
    with pytest.raises(ValueError, match="runtime.kernels"):
        RuntimeConfig(kernels="fast")


def test_missing_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv(cpu_kernels.ENV_KERNEL_DIR, str(tmp_path))
    with pytest.raises(RuntimeError, match="no-such-compiler.*runtime.kernels"):
        cpu_kernels.library_path()
    assert list(tmp_path.iterdir()) == []


def test_library_is_built_once_and_reused(monkeypatch, tmp_path):
    monkeypatch.setenv(cpu_kernels.ENV_KERNEL_DIR, str(tmp_path))
    monkeypatch.setattr(cpu_kernels, "_LIBRARY", {})
    path = cpu_kernels.library_path()
    assert path.startswith(str(tmp_path)) and [p.name for p in tmp_path.iterdir()] == [path.split("/")[-1]]
    stamp = (tmp_path / path.split("/")[-1]).stat().st_mtime_ns
    monkeypatch.setattr(cpu_kernels, "_LIBRARY", {})
    assert cpu_kernels.library_path() == path
    assert (tmp_path / path.split("/")[-1]).stat().st_mtime_ns == stamp
