"""Training-time test (TTT) of the EAGLE-3 draft as static-shape MindSpore Cells (docs/training.md).

Notation (one sample of T tokens, the trainer pads it to a length bucket; padding comes last):
``ids[t]`` tokens, ``aux[t]`` the teacher's low|mid|high features at t, ``P[t]`` the teacher's
distribution at t (``softmax(hidden[t] @ lm_head.T)``, i.e. the distribution of token t+1),
``a[t]`` = teacher argmax at t, ``m[t] = loss_mask[t] and t2d[a[t]]`` (positions whose teacher argmax
is outside the draft vocabulary are masked). Here ``loss_mask[t]`` is the batch mask of eagle_ms/train/ttt_data.py make_batch:
1 when the token *predicted* at t (token t+1) is an assistant token.

Unrolled step i = 0 .. S-1 (S = ``ttt_steps``, default 7), row j = 0 .. T-1:

    feature_i[j] = fc(aux[j])                 (i = 0)
                 = h_{i-1}[j]                 (i > 0: the draft's own pre-norm output, no fc, same row)
    token        = ids[j + 1 + i]             (0 beyond T: such rows are masked)
    RoPE position = j + i
    target       = P[j + 1 + i] restricted to the draft vocabulary, renormalised; weight m[j + 1 + i]
    h_i[j]       = midlayer(embed(token), feature_i[j]) attending to the keys below

so inputs, targets and masks shift left by one per step and the hidden state stays on its row.

Attention (the exact mask). Every step's keys/values are kept: K_s[j], s = 0..i. Query (i, j) sees

    step-0 keys K_0[k] for k <= j                    ("inference" mask, the default)
                     or k <= j - i                   ("eagle" mask: the SafeAILab/SpecForge code)
    its own diagonal  K_s[j] for s = 1 .. i          (the draft's own earlier outputs on this row)

and nothing else. Row j at step i is exactly the inference expansion at depth i after committing
the pairs 0..j (eagle_ms.eagle3_drafter: L = j + 1 committed pairs, root = ids[j+1]; the depth-t node
has token ids[L+t], position L-1+t, feature = its parent's hidden, and sees the committed pairs [0, L),
its ancestors and itself) when the drafted chain equals the data: tested against the drafter itself
(tests/test_ttt_loss.py). The "eagle" mask additionally hides step-0 keys j-i+1 .. j, which inference
does see (SafeAILab/EAGLE issue #247, SpecForge PR #245 discuss it); it is offered for comparison only.

Worked example, T = 4, step i = 2, row j = 2 (token ids[5], position 4, target P[5]):
    inference mask: K_0[0], K_0[1], K_0[2]  (pairs (aux0,ids1), (aux1,ids2), (aux2,ids3)),
                    K_1[2] (h_0[2] with ids[4], position 3), K_2[2] (itself)
    eagle mask:     K_0[0], K_1[2], K_2[2]
Row j < i under the eagle mask sees no step-0 key; its diagonal keys keep the row non-empty.

The step-0 part is one [T, T] matmul; the diagonal keys are per-row dot products (S-1 extra columns),
as in EAGLE-3 (no [T, S*T] attention).

Loss (soft cross-entropy, EAGLE-3): step i contributes
    L_i = sum_{b,j} m_i[b,j] * ( - sum_v P_i[b,j,v] log q_i[b,j,v] ) / max(sum_{b,j} m_i[b,j], 1)
over the GLOBAL batch (the counts are all-reduced across data-parallel ranks), and the loss is
sum_i decay^i * L_i (decay 0.8). Each rank returns ``world * (its share)`` so that the mean of the
ranks' gradients is the gradient of the global loss.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from eagle_ms.models.eagle3 import Eagle3Draft

NEG_INF = -1e30
MASK_MODES = ("inference", "eagle")


def shift_left(x, s: int):
    """x [B, T, ...] -> x[:, s:] followed by s zero rows (same shape). Example: [a,b,c,d], 2 -> [c,d,0,0]."""
    pad = ops.zeros((x.shape[0], s) + tuple(x.shape[2:]), x.dtype)
    return ops.concat((x[:, s:], pad), axis=1)


def step_terms(logprob, target_p, valid, shift: int):
    """One step's (sum of masked soft CE, number of loss positions), both fp32 scalars.

    logprob [B,T,Vd] draft log-softmax; target_p [B,T,Vd] teacher P restricted; valid [B,T] f32 m.
    """
    p = shift_left(target_p, shift)
    m = shift_left(valid, shift)
    ce = -(p * logprob).sum(axis=-1)  # [B, T]
    return (ce * m).sum(), m.sum()


class TeacherTargets(nn.Cell):
    """construct(hidden [B,T,Ht], loss_mask [B,T] f32) -> (P_d [B,T,Vd] f32, m [B,T] f32, argmax [B,T] i32).

    The frozen teacher head is a non-trainable Parameter ``teacher_lm_head`` [V, Ht]. This is its own
    graph (no gradient), so the [B*T, V] teacher logits never sit in the training graph's memory.
    """

    def __init__(self, lm_head: np.ndarray, used: np.ndarray, t2d: np.ndarray):
        super().__init__()
        self.head = Parameter(Tensor(np.asarray(lm_head, np.float32)), name="teacher_lm_head", requires_grad=False)
        self.used = Tensor(np.asarray(used, np.int32))  # [Vd] target ids of draft ids 0..Vd-1
        self.in_vocab = Tensor(np.asarray(t2d, np.float32))  # [V]
        self.matmul_t = ops.MatMul(transpose_b=True)

    def construct(self, hidden, loss_mask):
        b, t, h = hidden.shape
        logits = self.matmul_t(hidden.astype(ms.float32).reshape(b * t, h), self.head)  # [B*T, V]
        argmax = ops.argmax(logits, dim=-1).astype(ms.int32)
        inside = ops.gather(self.in_vocab, argmax, 0)
        p = ops.softmax(ops.gather(logits, self.used, 1), axis=-1)  # [B*T, Vd]
        return p.reshape(b, t, -1), loss_mask * inside.reshape(b, t), argmax.reshape(b, t)


class TTTDraft(nn.Cell):
    """The unrolled draft over the weights of an ``Eagle3Draft`` (parameters are not renamed or copied).

    ``unroll(input_ids [B,T] i32, aux [B,T,3Ht] f32) -> tuple of S pre-norm hiddens [B,T,H]``.
    """

    def __init__(self, draft: Eagle3Draft, ttt_steps: int, mask_mode: str = "inference"):
        super().__init__(auto_prefix=False)
        if isinstance(ttt_steps, bool) or not isinstance(ttt_steps, int) or ttt_steps < 1:
            raise ValueError(f"ttt_steps = {ttt_steps!r}: must be an integer >= 1")
        if mask_mode not in MASK_MODES:
            raise ValueError(f"ttt mask {mask_mode!r}: must be one of {MASK_MODES}")
        cfg = draft.config
        self.draft = draft
        self.steps, self.mask_shift = ttt_steps, 1 if mask_mode == "eagle" else 0
        self.num_heads, self.num_kv_heads, self.head_dim = (cfg.num_attention_heads, cfg.num_key_value_heads,
                                                            cfg.head_dim)
        self.groups = self.num_heads // self.num_kv_heads
        self.scale = 1.0 / float(np.sqrt(cfg.head_dim))

    def attend(self, q, keys, values, mask0):
        """q [B,Hq,T,D]; keys/values: tuples of i+1 [B,Hkv,T,D] (steps 0..i); mask0 [T,T] additive.

        -> [B, T, Hq*D]. Query head h reads KV head h // groups (the eager backend's convention).
        """
        b, _, t, d = q.shape
        hkv, g = self.num_kv_heads, self.groups
        qg = q.reshape(b, hkv, g * t, d)
        s0 = ops.matmul(qg, keys[0].swapaxes(-1, -2)).astype(ms.float32) * self.scale  # [B,Hkv,G*T,T]
        scores = s0.reshape(b, hkv, g, t, t) + mask0
        q5 = qg.reshape(b, hkv, g, t, d)
        if len(keys) > 1:  # diagonal keys: one dot product per row
            diag = [(q5 * k.expand_dims(2)).sum(axis=-1, keepdims=True).astype(ms.float32) * self.scale
                    for k in keys[1:]]
            scores = ops.concat([scores] + diag, axis=-1)
        probs = ops.softmax(scores, axis=-1)  # [B,Hkv,G,T,T+i]
        out = ops.matmul(probs[..., :t].reshape(b, hkv, g * t, t).astype(values[0].dtype), values[0])
        out = out.reshape(b, hkv, g, t, d)
        for s in range(1, len(values)):
            out = out + probs[..., t + s - 1:t + s].astype(values[s].dtype) * values[s].expand_dims(2)
        return out.reshape(b, self.num_heads, t, d).swapaxes(1, 2).reshape(b, t, self.num_heads * d)

    def unroll(self, input_ids, aux):
        draft = self.draft
        layer, attn = draft.midlayer, draft.midlayer.self_attn
        b, t = input_ids.shape
        feature = draft.fc(aux.astype(draft.fc.weight.dtype))  # [B,T,H]
        positions = ops.arange(t, dtype=ms.int32).reshape(1, t)
        rows = ops.arange(t, dtype=ms.int32).reshape(t, 1)
        keys, values, hiddens = (), (), ()
        for i in range(self.steps):
            ids = shift_left(input_ids, i + 1)
            emb = ops.gather(draft.embed_tokens.weight, ids, 0).astype(feature.dtype)
            x = layer.normed_inputs(emb, feature)                              # [B,T,2H]
            cos, sin = attn.head_tables(*draft.rotary(positions + i))
            q, k, v = attn.project(x, cos, sin)                                # [B,T,heads,D]
            q, k, v = q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2)
            keys += (k,)
            values += (v,)
            allowed = (positions <= rows - i * self.mask_shift).astype(ms.float32)  # [T,T] step-0 keys
            h = feature + attn.o_proj(self.attend(q, keys, values, (1.0 - allowed) * NEG_INF))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            hiddens += (h,)
            feature = h
        return hiddens


class TTTLoss(nn.Cell):
    """construct(input_ids [B,T] i32, aux [B,T,3Ht], target_p [B,T,Vd] f32, valid [B,T] f32, counts [S] f32)
    -> scalar.

    ``counts[i]`` is step i's number of loss positions over the GLOBAL batch, every micro-batch and every
    data-parallel rank (``step_counts`` of each micro-batch's ``valid``, summed, all-reduced, floored at 1),
    so the losses of the micro-batches of one step add up to the loss of the whole batch. The local loss is
    scaled by ``world`` so that averaging the ranks' gradients gives the global loss's gradient.
    """

    def __init__(self, core: TTTDraft, decay: float = 0.8, world: int = 1):
        super().__init__(auto_prefix=False)
        self.core = core
        self.weights = Tensor(np.asarray([decay ** i for i in range(core.steps)], np.float32))
        self.world = float(world)

    def construct(self, input_ids, aux, target_p, valid, counts):
        hiddens = self.core.unroll(input_ids, aux)
        sums = ()
        for i in range(self.core.steps):
            s, _ = step_terms(self.core.draft.logprobs(hiddens[i]), target_p, valid, i + 1)
            sums += (s,)
        return (self.weights * ops.stack(sums) / counts).sum() * self.world


def step_counts(valid: np.ndarray, steps: int) -> np.ndarray:
    """Host count of ``step_terms``'s loss positions: valid [B, T] -> [steps] float64, entry i = sum(valid[:, i+1:])."""
    return np.array([valid[:, i + 1:].sum(dtype=np.float64) for i in range(steps)])


class TTTEval(nn.Cell):
    """Forward only: construct(input_ids, aux, target_p, valid) ->
    (draft top-1 TARGET ids [S,B,T] i32, per-step CE sums [S] f32, per-step loss-position counts [S] f32)."""

    def __init__(self, core: TTTDraft):
        super().__init__(auto_prefix=False)
        self.core = core

    def construct(self, input_ids, aux, target_p, valid):
        draft = self.core.draft
        hiddens = self.core.unroll(input_ids, aux)
        tops, sums, counts = (), (), ()
        for i in range(self.core.steps):
            logprob = draft.logprobs(hiddens[i])
            top = ops.argmax(logprob, dim=-1).astype(ms.int32)
            tops += (top + ops.gather(draft.d2t, top, 0),)
            s, c = step_terms(logprob, target_p, valid, i + 1)
            sums += (s,)
            counts += (c,)
        return ops.stack(tops), ops.stack(sums), ops.stack(counts)


class AllReduceSum(nn.Cell):
    """Sum a small fp32 vector over the data-parallel ranks (host statistics: logged loss, eval counts)."""

    def __init__(self):
        super().__init__()
        self.op = ops.AllReduce()

    def construct(self, x):
        return self.op(x)
