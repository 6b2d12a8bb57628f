"""The TTT loss Cells vs a NumPy float64 reference written here, and the TTT simulation vs the inference drafter.

Reference (``np_ttt``): teacher targets (softmax over the draft vocabulary's teacher logits, mask =
loss_mask AND teacher argmax inside the draft vocabulary), then S unrolled steps, row by row with explicit
loops: step i row j gets token ids[j+1+i], RoPE position j+i, feature fc(aux[j]) (i = 0) or the step i-1
hidden of row j; it attends to step-0 keys k <= j ("inference") or k <= j-i ("eagle") and to its own
row's keys of steps 1..i; soft CE per step normalised by the step's loss positions, weights 0.8^i.

Second check: step i row j of the TTT unroll == the EAGLE-3 drafter (eagle_ms.eagle3_drafter, the
inference code) after committing pairs 0..j and expanding a chain with the data's tokens.
"""
import numpy as np
import pytest

from mindspore import Tensor, nn

from eagle_ms.draft_weights import load_draft_state, random_draft_state
from eagle_ms.drafting import TreeParams
from eagle_ms.eagle3_drafter import Eagle3Drafter
from eagle_ms.models.eagle3 import Eagle3Config, Eagle3Draft
from eagle_ms.models.ttt import TeacherTargets, TTTDraft, TTTEval, TTTLoss, step_counts

CFG = Eagle3Config(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=64, draft_vocab_size=40, target_hidden_size=24, aux_layer_ids=(0, 1, 2))
B, T, STEPS = 2, 9, 3


def _rms(x, w, eps=1e-5):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def _rope(x, pos, theta=10000.0):
    """x [heads, D] at one position."""
    d = x.shape[-1]
    ang = pos * theta ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(np.concatenate([ang, ang])), np.sin(np.concatenate([ang, ang]))
    return x * cos + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def np_targets(head, used, t2d, hidden, loss_mask):
    logits = hidden.astype(np.float64) @ head.astype(np.float64).T  # [B,T,V]
    argmax = logits.argmax(-1)
    sub = logits[..., used]
    p = np.exp(sub - sub.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True), loss_mask * t2d[argmax], argmax


def np_ttt(state, embed, ids, aux, p, m, steps, mode="inference", decay=0.8):
    """-> (loss, per-step CE sums [S], counts [S], hiddens [S, B, T, H], logprobs [S, B, T, Vd])."""
    w = {k: np.asarray(v, np.float64) for k, v in state.items() if k not in ("d2t", "t2d")}
    hq, hkv, d = CFG.num_attention_heads, CFG.num_key_value_heads, CFG.head_dim
    b_, t_ = ids.shape
    sums, counts = np.zeros(steps), np.zeros(steps)
    hiddens = np.zeros((steps, b_, t_, CFG.hidden_size))
    logps = np.zeros((steps, b_, t_, CFG.draft_vocab_size))
    a = "midlayer.self_attn."
    for b in range(b_):
        feature = aux[b].astype(np.float64) @ w["fc.weight"].T  # [T,H]
        ks, vs = [], []
        for i in range(steps):
            tok = np.array([ids[b, j + 1 + i] if j + 1 + i < t_ else 0 for j in range(t_)])
            x = np.concatenate([_rms(np.asarray(embed, np.float64)[tok], w["midlayer.input_layernorm.weight"]),
                                _rms(feature, w["midlayer.hidden_norm.weight"])], -1)
            q = (x @ w[a + "q_proj.weight"].T).reshape(t_, hq, d)
            k = (x @ w[a + "k_proj.weight"].T).reshape(t_, hkv, d)
            v = (x @ w[a + "v_proj.weight"].T).reshape(t_, hkv, d)
            q = np.stack([_rope(q[j], j + i) for j in range(t_)])
            k = np.stack([_rope(k[j], j + i) for j in range(t_)])
            ks.append(k)
            vs.append(v)
            out = np.zeros((t_, hq, d))
            for j in range(t_):
                lim = j if mode == "inference" else j - i
                for h in range(hq):
                    g = h // (hq // hkv)
                    keys = [ks[0][kk, g] for kk in range(lim + 1)] + [ks[s][j, g] for s in range(1, i + 1)]
                    vals = [vs[0][kk, g] for kk in range(lim + 1)] + [vs[s][j, g] for s in range(1, i + 1)]
                    sc = np.array([q[j, h] @ kk for kk in keys]) / np.sqrt(d)
                    pr = np.exp(sc - sc.max())
                    out[j, h] = (pr / pr.sum()) @ np.array(vals)
            hid = feature + out.reshape(t_, hq * d) @ w[a + "o_proj.weight"].T
            y = _rms(hid, w["midlayer.post_attention_layernorm.weight"])
            gate, up = y @ w["midlayer.mlp.gate_proj.weight"].T, y @ w["midlayer.mlp.up_proj.weight"].T
            hid = hid + (gate / (1 + np.exp(-gate)) * up) @ w["midlayer.mlp.down_proj.weight"].T
            logits = _rms(hid, w["norm.weight"]) @ w["lm_head.weight"].T
            logp = logits - logits.max(-1, keepdims=True)
            logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
            for j in range(t_):
                if j + 1 + i < t_:
                    sums[i] += m[b, j + 1 + i] * -(p[b, j + 1 + i] @ logp[j])
                    counts[i] += m[b, j + 1 + i]
            hiddens[i, b], logps[i, b] = hid, logp
            feature = hid
    loss = float(np.sum(decay ** np.arange(steps) * sums / np.maximum(counts, 1)))
    return loss, sums, counts, hiddens, logps


class Unroll(nn.Cell):
    def __init__(self, core):
        super().__init__(auto_prefix=False)
        self.core = core

    def construct(self, ids, aux):
        return self.core.unroll(ids, aux)


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(5)
    used = np.sort(rng.choice(CFG.vocab_size, CFG.draft_vocab_size, replace=False))
    state = random_draft_state(CFG, seed=3, std=0.3, used_tokens=used)
    embed = rng.normal(0, 1.0, (CFG.vocab_size, CFG.hidden_size)).astype(np.float32)
    head = rng.normal(0, 0.5, (CFG.vocab_size, CFG.target_hidden_size)).astype(np.float32)
    ids = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
    aux = rng.normal(0, 1.0, (B, T, 3 * CFG.target_hidden_size)).astype(np.float32)
    hidden = rng.normal(0, 1.0, (B, T, CFG.target_hidden_size)).astype(np.float32)
    loss_mask = (rng.random((B, T)) < 0.8).astype(np.float32)
    loss_mask[1, 6:] = 0  # a padded tail
    draft = Eagle3Draft(CFG, 1, 1, 1)
    load_draft_state(draft, state, embed=embed)
    t2d = state["t2d"]
    return dict(state=state, embed=embed, head=head, used=used, t2d=t2d, ids=ids, aux=aux, hidden=hidden,
                loss_mask=loss_mask, draft=draft)


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / max(np.max(np.abs(b)), 1e-12))


def test_teacher_targets_match_numpy(case):
    c = case
    cell = TeacherTargets(c["head"], c["used"], c["t2d"])
    p, m, arg = cell(Tensor(c["hidden"]), Tensor(c["loss_mask"]))
    rp, rm, rarg = np_targets(c["head"], c["used"], c["t2d"], c["hidden"], c["loss_mask"])
    assert _rel(p.asnumpy(), rp) < 1e-5
    np.testing.assert_array_equal(arg.asnumpy(), rarg)
    np.testing.assert_array_equal(m.asnumpy(), rm)
    assert 0 < rm.sum() < c["loss_mask"].sum()  # some argmax fall outside the draft vocabulary


@pytest.mark.parametrize("mode, steps", [("inference", STEPS), ("eagle", STEPS), ("inference", 1)])
def test_ttt_loss_matches_numpy_reference(case, mode, steps):
    c = case
    p, m, _ = np_targets(c["head"], c["used"], c["t2d"], c["hidden"], c["loss_mask"])
    ref_loss, ref_sums, ref_counts, _, _ = np_ttt(c["state"], c["embed"], c["ids"], c["aux"], p, m, steps, mode)
    core = TTTDraft(c["draft"], steps, mode)
    args = (Tensor(c["ids"]), Tensor(c["aux"]), Tensor(p.astype(np.float32)), Tensor(m.astype(np.float32)))
    counts = step_counts(m, steps)
    np.testing.assert_array_equal(counts, ref_counts)
    loss = float(TTTLoss(core)(*args, Tensor(np.maximum(counts, 1).astype(np.float32))).asnumpy())
    assert abs(loss - ref_loss) / abs(ref_loss) < 1e-4, (loss, ref_loss)
    tops, sums, counts = TTTEval(core)(*args)
    assert _rel(sums.asnumpy(), ref_sums) < 1e-4
    np.testing.assert_array_equal(counts.asnumpy(), ref_counts)


def test_ttt_hidden_states_match_numpy_and_masks_differ(case):
    c = case
    p, m, _ = np_targets(c["head"], c["used"], c["t2d"], c["hidden"], c["loss_mask"])
    outs = {}
    for mode in ("inference", "eagle"):
        hid = Unroll(TTTDraft(c["draft"], STEPS, mode))(Tensor(c["ids"]), Tensor(c["aux"]))
        ref = np_ttt(c["state"], c["embed"], c["ids"], c["aux"], p, m, STEPS, mode)[3]
        got = np.stack([h.asnumpy() for h in hid])
        assert _rel(got, ref) < 1e-4
        outs[mode] = got
    np.testing.assert_allclose(outs["inference"][0], outs["eagle"][0], rtol=1e-6)  # step 0 is the same
    assert np.max(np.abs(outs["inference"][1] - outs["eagle"][1])) > 1e-3  # later steps are not


def test_ttt_steps_equal_the_inference_drafter_chain(case):
    """Step i, row j == the drafter's depth-i expansion after committing pairs 0..j (default mask)."""
    c = case
    hid = Unroll(TTTDraft(c["draft"], STEPS))(Tensor(c["ids"]), Tensor(c["aux"]))
    hid = np.stack([h.asnumpy() for h in hid])  # [S, B, T, H]
    params = TreeParams(budget=STEPS, max_depth=STEPS, top_k=1)
    capacity, chunk = 16, 4
    inf = Eagle3Draft(CFG, 1, capacity + 8, CFG.draft_vocab_size)
    load_draft_state(inf, c["state"], embed=c["embed"])
    drafter = Eagle3Drafter(inf, params, capacity, chunk)
    b = 1
    ids, aux = c["ids"][b].astype(np.int64), c["aux"][b]
    for j in (0, 3, T - 1 - STEPS):
        drafter.begin(ids[:j + 1], aux[:j + 1], int(ids[j + 1]))
        assert _rel(drafter._root.hidden, hid[0, b, j]) < 1e-4
        parent = np.zeros(1, np.int64)
        for depth in range(1, STEPS):
            drafter._expand(depth, parent, np.array([ids[j + 1 + depth]]))
            assert _rel(drafter._prev.hidden[0], hid[depth, b, j]) < 1e-4, (j, depth)
