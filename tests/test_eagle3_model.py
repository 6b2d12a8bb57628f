"""EAGLE-3 draft Cell vs an independent NumPy float64 draft forward (written here, from the architecture).

Covers: extend (teacher features through fc) and expand (own hidden, tree-masked, scratch slots) graphs
vs the reference, for a GQA draft with the full vocabulary and an MHA draft with explicit head_dim,
target_hidden_size != hidden_size and a reduced vocabulary (d2t); in-graph top-k == reference top-k;
one compile per shape; the shared teacher embedding; config validation. Extend and expand also run with
the fused CPU kernels (eagle_ms/models/cpu_kernels.py) against the same reference: the expand graph is then
two kernels around the cache write (``DraftFront``, ``DraftBack``: eagle_ms/models/draft_kernels.cc; the
extend ``DraftExtendFront`` + ``DraftBack``), whose rows are also checked to be bitwise
independent of the other rows and whose bad token ids are refused; with float16 copies of weight matrices
that are exactly float16 (``kernel_weight_dtype``) the kernels give the same bits as with the float32 ones,
and a draft built for float16 copies refuses weights float16 does not hold exactly, before writing any.

The reference (``np_draft``) is also the second implementation used by test_drafting.py.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from eagle_ms.models.weight_tiles import unpack_tiles
from eagle_ms.draft_weights import draft_to_target, random_draft_state
from eagle_ms.models.eagle3 import KERNEL_EXTEND_ROWS, Eagle3Config, Eagle3Draft, Eagle3Expand
from eagle_ms.draft_weights import check_draft_state, load_draft_state
from eagle_ms.safetensors_format import CheckpointError
from helpers_models import TINY, build_teacher, float16_matrices

TOL = 1e-4

GQA_FULL = Eagle3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                        vocab_size=64, draft_vocab_size=64, target_hidden_size=32, aux_layer_ids=(0, 1, 2))
MHA_REDUCED = Eagle3Config(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=2,
                           head_dim=24, vocab_size=64, draft_vocab_size=40, target_hidden_size=48,
                           aux_layer_ids=(2, 5, 9), rope_theta=500.0, rms_norm_eps=1e-6)
CONFIGS = {"gqa-full": GQA_FULL, "mha-reduced-headdim24": MHA_REDUCED}
CAPACITY = 40


# ----------------------------------------------------------------------------- the NumPy fp64 reference

def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, positions, theta):
    """x [heads, T, D]: rotate-half RoPE at positions [T]."""
    d = x.shape[-1]
    ang = positions[:, None].astype(np.float64) * theta ** (-np.arange(0, d, 2) / d)[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    return x * cos + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def np_draft(cfg, state, embed, tokens, features, from_teacher, positions, allowed):
    """Full-sequence fp64 draft forward.

    tokens [T]; features: T rows, row t a teacher feature [3Ht] (from_teacher[t]) or own hidden [H];
    positions [T]; allowed [T, T] bool. Returns (logprob over the DRAFT vocab [T, Vd], hidden [T, H]).
    """
    w = {k: np.asarray(v, np.float64) for k, v in state.items() if k not in ("d2t", "t2d")}
    eps, hq, hkv, d = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    feat = np.stack([w["fc.weight"] @ np.asarray(f, np.float64) if t else np.asarray(f, np.float64)
                     for f, t in zip(features, from_teacher)])  # [T, H]
    emb = np.asarray(embed, np.float64)[np.asarray(tokens)]
    x = np.concatenate([_rms(emb, w["midlayer.input_layernorm.weight"], eps),
                        _rms(feat, w["midlayer.hidden_norm.weight"], eps)], -1)  # [T, 2H]
    n = x.shape[0]
    p = "midlayer.self_attn."
    q = (x @ w[p + "q_proj.weight"].T).reshape(n, hq, d).transpose(1, 0, 2)
    k = (x @ w[p + "k_proj.weight"].T).reshape(n, hkv, d).transpose(1, 0, 2)
    v = (x @ w[p + "v_proj.weight"].T).reshape(n, hkv, d).transpose(1, 0, 2)
    pos = np.asarray(positions)
    q, k = _rope(q, pos, cfg.rope_theta), _rope(k, pos, cfg.rope_theta)
    kv = np.arange(hq) // (hq // hkv)
    s = q @ k[kv].transpose(0, 2, 1) / np.sqrt(d)
    s = np.where(np.asarray(allowed)[None], s, -np.inf)
    prob = np.exp(s - s.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    attn = (prob @ v[kv]).transpose(1, 0, 2).reshape(n, hq * d)
    h = feat + attn @ w[p + "o_proj.weight"].T
    m = _rms(h, w["midlayer.post_attention_layernorm.weight"], eps)
    gate = m @ w["midlayer.mlp.gate_proj.weight"].T
    act = gate / (1 + np.exp(-gate)) * (m @ w["midlayer.mlp.up_proj.weight"].T)  # silu(gate) * up
    h = h + act @ w["midlayer.mlp.down_proj.weight"].T
    logits = _rms(h, w["norm.weight"], eps) @ w["lm_head.weight"].T
    mx = logits.max(-1, keepdims=True)
    return logits - mx - np.log(np.exp(logits - mx).sum(-1, keepdims=True)), h


def rel_err(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / max(float(np.max(np.abs(b))), 1e-6))


def full_target_logprob(values, ids, vocab):
    """Cell top-K (values [T, K], target ids [T, K]) with K = Vd -> [T, V] (-inf outside the draft vocab)."""
    out = np.full((values.shape[0], vocab), -np.inf)
    np.put_along_axis(out, ids.astype(np.int64), values, axis=1)
    return out


# ----------------------------------------------------------------------------- fixtures

class Built:
    def __init__(self, name, top_k=None, kernel_weight_dtype="float32"):
        """``name``: a CONFIGS key, with ``:cpu`` for the draft built with the fused CPU kernels.
        ``kernel_weight_dtype`` 'float16': the matrices rounded to float16, the kernels reading float16 copies."""
        config_name, _, kernels = name.partition(":")
        cfg = CONFIGS[config_name]
        self.cfg = cfg
        self.state = check_draft_state(random_draft_state(cfg, seed=3, std=0.3), cfg)
        if kernel_weight_dtype == "float16":
            self.state = float16_matrices(self.state, cfg)
        self.embed = np.random.default_rng(4).standard_normal((cfg.vocab_size, cfg.hidden_size)).astype(np.float32)
        self.draft = Eagle3Draft(cfg, 1, CAPACITY, top_k or cfg.draft_vocab_size, kernels=kernels or "composite",
                                 kernel_weight_dtype=kernel_weight_dtype)
        load_draft_state(self.draft, self.state, embed=self.embed)
        self.expand = Eagle3Expand(self.draft)
        self.targets = draft_to_target(self.state["d2t"])

    def ref(self, *args):
        return np_draft(self.cfg, self.state, self.embed, *args)


@pytest.fixture(scope="module", params=sorted(CONFIGS) + ["gqa-full:cpu", "mha-reduced-headdim24:cpu"])
def built(request):
    return Built(request.param)


@pytest.fixture(scope="module")
def top4():
    """The reduced-vocabulary draft with an in-graph top-4 (top-k and compile-count tests)."""
    return Built("mha-reduced-headdim24", top_k=4)


def call(cell, ids, feats, positions, slots, allowed):
    out = cell(Tensor(np.asarray(ids, np.int32)[None]), Tensor(np.asarray(feats, np.float32)[None]),
               Tensor(np.asarray(positions, np.int32)[None]), Tensor(np.asarray(slots, np.int32)[None]),
               Tensor(np.asarray(allowed, bool)[None]))
    return [o.asnumpy()[0] for o in out]


def causal(start, n, capacity=CAPACITY):
    return np.arange(capacity)[None, :] <= start + np.arange(n)[:, None]


# ----------------------------------------------------------------------------- tests

def test_reference_sanity():
    """The reference is causal, and fc is applied only to teacher rows."""
    b = Built("gqa-full", top_k=1)
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 64, 6)
    feats = list(rng.standard_normal((6, 96)))
    allowed = np.tril(np.ones((6, 6), bool))
    lp, h = b.ref(toks, feats, [True] * 6, np.arange(6), allowed)
    feats2 = feats[:4] + list(rng.standard_normal((2, 96)))
    lp2, h2 = b.ref(toks, feats2, [True] * 6, np.arange(6), allowed)
    assert np.allclose(h[:4], h2[:4]) and not np.allclose(h[4:], h2[4:])
    np.testing.assert_allclose(np.exp(lp).sum(-1), 1.0, rtol=1e-12)


def test_extend_matches_reference(built):
    cfg = built.cfg
    rng = np.random.default_rng(11)
    n = 7  # the committed length of the expand test: one extend graph per config
    toks = rng.integers(0, cfg.vocab_size, n)
    feats = rng.standard_normal((n, 3 * cfg.target_hidden_size))
    pos = np.arange(n) + 3  # positions need not equal slots
    values, ids, hidden = call(built.draft, toks, feats, pos, np.arange(n), causal(0, n))
    lp, h = built.ref(toks, list(feats), [True] * n, pos, np.tril(np.ones((n, n), bool)))
    assert hidden.dtype == np.float32 and values.shape == (n, cfg.draft_vocab_size)
    assert rel_err(hidden, h) < TOL
    want = np.full((n, cfg.vocab_size), -np.inf)
    want[:, built.targets] = lp
    got = full_target_logprob(values, ids, cfg.vocab_size)
    assert np.array_equal(np.isinf(got), np.isinf(want)), "top-k ids are not the draft vocabulary in target ids"
    assert rel_err(got[:, built.targets], lp) < TOL
    assert np.all(np.diff(values, axis=-1) <= 0), "top-k not sorted descending"


def test_expand_tree_rows_match_reference(built):
    """Committed prefix (extend), then two expand calls in the scratch region with a tree mask."""
    cfg = built.cfg
    rng = np.random.default_rng(12)
    n, scratch = 7, 30
    toks = rng.integers(0, cfg.vocab_size, n)
    feats = rng.standard_normal((n, 3 * cfg.target_hidden_size))
    _, _, hid = call(built.draft, toks, feats, np.arange(n), np.arange(n), causal(0, n))
    # depth 1: 3 rows, children of the last pair (feature = its hidden); depth 2: rows with parents [2, 0, 2]
    t1 = rng.integers(0, cfg.vocab_size, 3)
    s1 = scratch + np.arange(3)
    vis1 = np.zeros((3, CAPACITY), bool)
    vis1[:, :n] = True
    vis1[np.arange(3), s1] = True
    _, _, h1 = call(built.expand, t1, np.repeat(hid[-1:], 3, 0), np.full(3, n), s1, vis1)
    par = np.array([2, 0, 2])
    t2 = rng.integers(0, cfg.vocab_size, 3)
    s2 = scratch + 3 + np.arange(3)
    vis2 = vis1[par].copy()
    vis2[np.arange(3), s2] = True
    v2, i2, h2 = call(built.expand, t2, h1[par], np.full(3, n + 1), s2, vis2)
    # reference: one sequence of n + 6 rows; allowed by the same visibility, columns = rows
    cols = np.concatenate([np.arange(n), s1, s2])
    allowed = np.concatenate([causal(0, n), vis1, vis2])[:, cols]
    ref_feats = list(feats) + list(np.repeat(hid[-1:], 3, 0).astype(np.float64)) + list(h1[par].astype(np.float64))
    lp, h = built.ref(np.concatenate([toks, t1, t2]), ref_feats, [True] * n + [False] * 6,
                      np.concatenate([np.arange(n), np.full(3, n), np.full(3, n + 1)]), allowed)
    assert rel_err(h1, h[n:n + 3]) < TOL and rel_err(h2, h[n + 3:]) < TOL
    got = full_target_logprob(v2, i2, cfg.vocab_size)[:, built.targets]
    assert rel_err(got, lp[n + 3:]) < TOL


@pytest.fixture(scope="module")
def cpu_expand():
    return Built("mha-reduced-headdim24:cpu", top_k=4)


def test_draft_expand_kernel_rows_do_not_depend_on_the_other_rows(cpu_expand):
    """The host path's tree equals the device tree kernel's only if a row's bits do not depend on which rows
    share its call: three rows in one call == each row alone, every output bit for bit. (That the rows' K/V reach
    the cache is checked by the depth-2 rows of ``test_expand_tree_rows_match_reference``.)"""
    b, cfg = cpu_expand, cpu_expand.cfg
    rng = np.random.default_rng(21)
    n = 9
    _, _, hid = call(b.draft, rng.integers(0, 64, n), rng.standard_normal((n, 3 * cfg.target_hidden_size)),
                     np.arange(n), np.arange(n), causal(0, n))
    slots = 30 + np.arange(3)
    vis = np.zeros((3, CAPACITY), bool)
    vis[:, :n] = True
    vis[np.arange(3), slots] = True
    toks, feats = rng.integers(0, 64, 3), hid[[8, 2, 5]]
    together = call(b.expand, toks, feats, np.full(3, n), slots, vis)
    for r in range(3):
        alone = call(b.expand, toks[r:r + 1], feats[r:r + 1], np.full(1, n), slots[r:r + 1], vis[r:r + 1])
        for got, want in zip(alone, together):
            np.testing.assert_array_equal(got[0], want[r])


def test_extend_kernel_skips_padding_rows_and_long_extends_run_the_ops(cpu_expand):
    """An extend with ``last_row`` 4 computes row 4's outputs only (rows 0..4's K/V): the same bits as a call
    computing all 8 rows, zeros elsewhere; an expand after it sees the same cache as after the full call. An
    extend longer than KERNEL_EXTEND_ROWS (a prompt chunk) runs the MindSpore ops and still equals the float64
    reference."""
    b, cfg = cpu_expand, cpu_expand.cfg
    rng = np.random.default_rng(22)
    n = 8
    toks, feats = rng.integers(0, 64, n), rng.standard_normal((n, 3 * cfg.target_hidden_size))
    vis = np.zeros((1, CAPACITY), bool)
    vis[0, :5] = vis[0, 30] = True

    def expand_after():  # one row over committed pairs 0..4 and its own slot 30
        return call(b.expand, toks[:1], np.ones((1, cfg.hidden_size)), [5], [30], vis)

    full = call(b.draft, toks, feats, np.arange(n), np.arange(n), causal(0, n))
    after_full = expand_after()
    call(b.draft, rng.integers(0, 64, n), feats[::-1], np.arange(n), np.arange(n), causal(0, n))  # other K/V
    tensors = [Tensor(np.asarray(a, dt)[None]) for a, dt in ((toks, np.int32), (feats, np.float32),
                                                             (np.arange(n), np.int32), (np.arange(n), np.int32),
                                                             (causal(0, n), bool))]
    part = [o.asnumpy()[0] for o in b.draft(*tensors, Tensor(np.array([4], np.int32)))]
    for got, want in zip(part, full):
        np.testing.assert_array_equal(got[4], want[4])
        assert not got[:4].any() and not got[5:].any()
    for got, want in zip(expand_after(), after_full):
        np.testing.assert_array_equal(got, want)
    m = KERNEL_EXTEND_ROWS + 1
    toks, feats = rng.integers(0, 64, m), rng.standard_normal((m, 3 * cfg.target_hidden_size))
    values, ids, hidden = call(b.draft, toks, feats, np.arange(m), np.arange(m), causal(0, m))
    lp, h = b.ref(toks, list(feats), [True] * m, np.arange(m), np.tril(np.ones((m, m), bool)))
    assert rel_err(hidden, h) < TOL
    order = np.argsort(-lp, axis=-1, kind="stable")[:, :4]
    np.testing.assert_array_equal(ids, b.targets[order])


def test_float16_weight_copies_give_the_float32_kernels_bits():
    """The layer kernels reading float16 copies of weight matrices that float16 holds exactly: extend
    (``DraftExtendFront`` with a float16 fc) and expand outputs, and the K/V they leave in the cache, are bit
    for bit those of the kernels reading the float32 Parameters, and match the float64 reference. The float16
    draft's matrices (and only those) are float16 copies."""
    half = Built("mha-reduced-headdim24:cpu", top_k=4, kernel_weight_dtype="float16")
    full = Built("mha-reduced-headdim24:cpu", top_k=4)
    load_draft_state(full.draft, half.state, embed=half.embed)
    assert [p.dtype for p in half.draft.half_matrices.matrices()] == [ms.float16] * 6
    assert full.draft.half_matrices is None
    for h, f in zip(half.draft.half_matrices.matrices(), full.draft.float_matrices()):
        np.testing.assert_array_equal(unpack_tiles(h.asnumpy()).astype(np.float32), f.asnumpy())
    cfg, rng = half.cfg, np.random.default_rng(23)
    n = 7
    toks, feats = rng.integers(0, 64, n), rng.standard_normal((n, 3 * cfg.target_hidden_size))
    slots = 30 + np.arange(3)
    vis = np.zeros((3, CAPACITY), bool)
    vis[:, :n] = True
    vis[np.arange(3), slots] = True
    outs = []
    for b in (half, full):
        extend = call(b.draft, toks, feats, np.arange(n), np.arange(n), causal(0, n))
        expand = call(b.expand, toks[:3], extend[2][[6, 1, 3]], np.full(3, n), slots, vis)
        cache = b.draft.midlayer.self_attn.kv_cache
        outs.append(extend + expand + [cache.k_cache.asnumpy(), cache.v_cache.asnumpy()])
    for got, want in zip(*outs):
        np.testing.assert_array_equal(got, want)
    lp, h = half.ref(toks, list(feats), [True] * n, np.arange(n), np.tril(np.ones((n, n), bool)))
    assert rel_err(outs[0][2], h) < TOL
    np.testing.assert_array_equal(outs[0][1], half.targets[np.argsort(-lp, axis=-1, kind="stable")[:, :4]])
    head = half.draft.half_matrices.lm_head
    head.set_data(Tensor(np.zeros(head.shape, np.float16)))  # the kernels read the copies: uniform log-probs
    again = call(half.expand, toks[:3], outs[0][2][[6, 1, 3]], np.full(3, n), slots, vis)
    np.testing.assert_allclose(again[0], np.full((3, 4), -np.log(cfg.draft_vocab_size)), rtol=1e-6)


def test_float16_weight_copies_refuse_inexact_weights_before_writing():
    """A draft built for float16 copies refuses a state whose matrices float16 does not hold exactly,
    naming the keys, and keeps the weights it had."""
    half = Built("mha-reduced-headdim24:cpu", top_k=4, kernel_weight_dtype="float16")
    before = [p.asnumpy().copy() for p in half.draft.float_matrices() + half.draft.half_matrices.matrices()]
    bad = dict(half.state)
    bad["midlayer.mlp.down_proj.weight"] = bad["midlayer.mlp.down_proj.weight"] + np.float32(1e-6)
    with pytest.raises(CheckpointError, match="midlayer.mlp.down_proj.weight.*float16"):
        load_draft_state(half.draft, bad, embed=half.embed)
    for p, want in zip(half.draft.float_matrices() + half.draft.half_matrices.matrices(), before):
        np.testing.assert_array_equal(p.asnumpy(), want)
    with pytest.raises(ValueError, match="kernel_weight_dtype"):
        Eagle3Draft(half.cfg, 1, CAPACITY, 4, kernels="cpu", kernel_weight_dtype="bfloat16")


def test_draft_expand_kernel_refuses_a_token_outside_the_vocabulary(cpu_expand):
    vis = np.zeros((1, CAPACITY), bool)
    vis[0, 30] = True
    with pytest.raises(RuntimeError):
        call(cpu_expand.expand, [64], np.zeros((1, 32)), [0], [30], vis)


def test_in_graph_top_k_equals_reference_top_k(top4):
    b = top4
    cfg = b.cfg
    rng = np.random.default_rng(13)
    n = 6
    toks = rng.integers(0, cfg.vocab_size, n)
    feats = rng.standard_normal((n, 3 * cfg.target_hidden_size))
    values, ids, _ = call(b.draft, toks, feats, np.arange(n), np.arange(n), causal(0, n))
    lp, _ = b.ref(toks, list(feats), [True] * n, np.arange(n), np.tril(np.ones((n, n), bool)))
    order = np.argsort(-lp, axis=-1, kind="stable")[:, :4]
    assert ids.dtype == np.int32 and values.shape == (n, 4)
    np.testing.assert_array_equal(ids, b.targets[order])
    assert rel_err(values, np.take_along_axis(lp, order, -1)) < TOL


def test_compiles_once_per_shape(top4):
    b = top4
    rng = np.random.default_rng(14)

    def extend(n, width=CAPACITY):
        call(b.draft, rng.integers(0, 64, n), rng.standard_normal((n, 144)), np.arange(n) + int(rng.integers(9)),
             np.arange(n), causal(0, n, width))

    def expand(n):
        call(b.expand, rng.integers(0, 64, n), rng.standard_normal((n, 32)), np.full(n, 5), 30 + np.arange(n),
             causal(0, n) | (rng.random((n, CAPACITY)) < 0.2))

    def counts():
        return len(b.draft.compile_cache), len(b.expand.compile_cache)

    extend(6)  # the top-k test's shape
    expand(3)
    base_d, base_e = counts()
    for _ in range(3):
        extend(6)
        expand(3)
    assert counts() == (base_d, base_e), "new values recompiled"
    extend(5)
    assert counts() == (base_d + 1, base_e), "one new N must add exactly one graph"
    extend(6, width=16)
    assert counts() == (base_d + 2, base_e), "one new attention window must add exactly one graph"
    extend(6)
    expand(3)
    assert counts() == (base_d + 2, base_e)


def test_shares_the_teacher_embedding_without_renaming_it():
    teacher, _ = build_teacher(16)
    names_before = [n for n, _ in teacher.parameters_and_names()]
    cfg = GQA_FULL
    emb = teacher.model.embed_tokens.weight
    draft = Eagle3Draft(cfg, 1, CAPACITY, 3, embed=emb)
    Eagle3Expand(draft)
    assert draft.shares_embedding and draft.embed_tokens.weight is emb
    assert [n for n, _ in teacher.parameters_and_names()] == names_before
    assert TINY.hidden_size == cfg.hidden_size
    load_draft_state(draft, random_draft_state(cfg, 1))
    with pytest.raises(ValueError, match="shares the teacher"):
        load_draft_state(draft, random_draft_state(cfg, 1), embed=np.zeros((64, 32)))
    with pytest.raises(ValueError, match="shared embedding has shape"):
        Eagle3Draft(Eagle3Config(**{**GQA_FULL.__dict__, "vocab_size": 80, "draft_vocab_size": 80}),
                    1, CAPACITY, 3, embed=emb)


@pytest.mark.parametrize("field, value, match", [
    ("draft_vocab_size", 65, "draft_vocab_size"), ("num_key_value_heads", 3, "num_key_value_heads"),
    ("hidden_size", 0, "hidden_size"), ("head_dim", 7, "head_dim"), ("rope_theta", 0.0, "rope_theta"),
    ("aux_layer_ids", (1, 2), "aux_layer_ids"), ("target_hidden_size", True, "target_hidden_size"),
])
def test_config_validation_names_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        Eagle3Config(**{**GQA_FULL.__dict__, "head_dim": None, field: value})


def test_top_k_validated():
    for k in (0, 65, True):
        with pytest.raises(ValueError, match="top_k"):
            Eagle3Draft(GQA_FULL, 1, CAPACITY, k)
