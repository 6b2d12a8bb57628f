"""EAGLE-3 draft model as MindSpore Cells: one decoder layer over [token embedding; fused teacher feature].

Architecture (SafeAILab ``cnets.py`` / SGLang / vLLM ``LlamaForCausalLMEagle3``; docs/eagle3_format.md):

    feature  = fc(teacher_aux)          teacher_aux [B,N,3*Ht] (low|mid|high)  -- "extend" inputs only
             | own hidden               the draft's previous pre-norm output [B,N,H]  -- "expand" inputs
    emb      = embed_tokens[input_ids]  the teacher's (frozen) token embedding
    x        = concat(input_layernorm(emb), hidden_norm(feature))             [B,N,2H]
    h        = feature + o_proj(attn(q,k,v = proj(x)))                         residual on the feature
    h        = h + mlp(post_attention_layernorm(h))                            pre-norm output = next feature
    logprob  = log_softmax(lm_head(norm(h)))                                   over the draft vocabulary
    target   = draft_id + d2t[draft_id]                                        reduced vocab -> teacher ids

Input alignment (EAGLE): pair j = (feature of position j, token at position j+1) predicts the token at
j+2; pair j has RoPE position j and, when committed, draft-cache slot j.

Two fixed-shape graphs share ONE set of weights and ONE static KV cache:

    Eagle3Draft  (extend): (input_ids [B,N] i32, features [B,N,3Ht], position_ids [B,N] i32,
                            cache_slots [B,N] i32, attn_mask [B,N,S] bool)
    Eagle3Expand (expand): same, but features are the draft's own hidden [B,N,H] (no fc)

both returning ``(topk_logprob [B,N,K] f32, topk_target_ids [B,N,K] i32, hidden [B,N,H])`` with the
top-k taken in the graph. The extend graph also takes ``last_row [B] i32`` (the last real row) and keeps
that row's outputs, the next tree's root pair, on the device (``RootPairStore``), so a device-resident
tree step (eagle_ms/models/draft_tree_step.py) can start from it without the host. K/V of the N rows
are written at ``cache_slots`` before attention; the mask (True = may attend to that slot) is the single
mask source, converted by the attention backend. Its width W <= S selects the attention window: only
cache slots [0, W) are read (one graph per (N, W)).

Token embedding: the draft SHARES the teacher's ``model.embed_tokens.weight`` Parameter when it is
built from a teacher Cell (no second [V, H] copy on the device, identical by construction, and frozen
because inference never writes it); without a teacher Cell it owns a frozen copy (``requires_grad``
False) loaded from the teacher checkpoint. Either way it is not draft-checkpoint content.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import initializer

from eagle_ms.models.kv_cache import flat_rows
from eagle_ms.config import fail
from eagle_ms.models import cpu_kernels
from eagle_ms.models.attention_layer import CachedAttention
from eagle_ms.models.layers import DTYPES, MLP, Linear, RMSNorm, Rotary, fused_kernel


# Extend calls of at most this many rows (the step's D+1-row extends) run the draft layer kernel; longer ones
# (prompt chunks) the MindSpore ops, whose matmuls are faster over many rows (docs/teacher_profile.md).
KERNEL_EXTEND_ROWS = 32


def _fail(key: str, value, why: str) -> None:
    fail(key, value, why, kind="draft config")


@dataclass(frozen=True)
class Eagle3Config:
    """EAGLE-3 draft architecture (the fields of an EAGLE-3 ``config.json``, see docs/eagle3_format.md).

    ``vocab_size`` / ``target_hidden_size`` / ``aux_layer_ids`` describe the TEACHER the draft was
    trained for; they must match it (checked by ``eagle_ms.draft_weights.check_draft_matches_teacher``).
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # teacher (target) vocabulary
    draft_vocab_size: int  # lm_head rows
    target_hidden_size: int  # teacher hidden size; fc is Linear(3 * target_hidden_size -> hidden_size)
    aux_layer_ids: tuple[int, int, int]  # teacher layers whose INPUT hidden states are the features
    head_dim: int | None = None  # None -> hidden_size // num_attention_heads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                     "vocab_size", "draft_vocab_size", "target_hidden_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                _fail(name, value, "must be an integer >= 1")
        if self.draft_vocab_size > self.vocab_size:
            _fail("draft_vocab_size", self.draft_vocab_size, f"must be <= vocab_size {self.vocab_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            _fail("num_key_value_heads", self.num_key_value_heads,
                  f"must divide num_attention_heads {self.num_attention_heads}")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                _fail("hidden_size", self.hidden_size, "must be divisible by num_attention_heads")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or self.head_dim < 2 \
                or self.head_dim % 2:
            _fail("head_dim", self.head_dim, "must be an even integer >= 2 (rotary embedding)")
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                _fail(name, value, "must be a number > 0")
        ids = self.aux_layer_ids
        if not isinstance(ids, (tuple, list)) or len(ids) != 3 or any(
                isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            _fail("aux_layer_ids", ids, "must be 3 non-negative layer indices")
        object.__setattr__(self, "aux_layer_ids", tuple(ids))


class DraftMidLayer(nn.Cell):
    """The EAGLE-3 decoder layer (HF names under ``midlayer.``)."""

    def __init__(self, cfg: Eagle3Config, batch: int, capacity: int, backend: str, dtype, kernels: str = "composite"):
        super().__init__()
        h = cfg.hidden_size
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps, dtype)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps, dtype)
        self.self_attn = CachedAttention(2 * cfg.hidden_size, cfg.hidden_size, cfg.num_attention_heads,
                                         cfg.num_key_value_heads, cfg.head_dim, False, batch, capacity,
                                         backend, dtype, kernels)  # q/k/v over the 2H concat, no bias
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps, dtype, kernels)
        self.mlp = MLP(h, cfg.intermediate_size, dtype, kernels)
        # kernels 'cpu': the embedding lookup and both input norms in one kernel (cpu_kernels.EmbedPairNorm)
        self.embed_pair_norm = fused_kernel(kernels, cpu_kernels.embed_pair_norm_op)
        self.eps_tensor = Tensor(np.array([cfg.rms_norm_eps], np.float32))

    def construct(self, normed_in, feature, cos, sin, rows, mask):
        """normed_in [B,N,2H] (``embedded_inputs``), feature [B,N,H] -> (h, mlp_out) [B,N,H] each: the layer's
        pre-norm output is h + mlp_out (the residual is on the feature, not the embedding); the caller adds
        them together with its final norm (``RMSNorm.residual``: one kernel with the 'cpu' kernels)."""
        attn = self.self_attn(normed_in, cos, sin, rows, mask)  # o_proj has no bias
        h, normed = self.post_attention_layernorm.residual(feature, attn)
        return h, self.mlp(normed)

    def embedded_inputs(self, table, input_ids, feature):
        """concat(input_layernorm(table[input_ids]), hidden_norm(feature)) [B,N,2H]: with the 'cpu' kernels
        one kernel (the lookup and both norms), else the gather and ``normed_inputs``."""
        if self.embed_pair_norm is not None:
            return self.embed_pair_norm(table, input_ids.astype(ms.int32), feature, self.input_layernorm.weight,
                                        self.hidden_norm.weight, self.eps_tensor)
        return self.normed_inputs(ops.gather(table, input_ids, 0).astype(feature.dtype), feature)

    def normed_inputs(self, emb, feature):
        """concat(input_layernorm(emb), hidden_norm(feature)) [B,N,2H], both norms in one pass over the
        stacked [B,N,2,H] (``RMSNorm``'s math per half; 8 kernels instead of 13). Both norms have the
        config's one ``rms_norm_eps`` (``DraftMidLayer.__init__``)."""
        b, n, h = emb.shape
        both = ops.concat((emb, feature), axis=-1).astype(ms.float32).reshape(b, n, 2, h)
        var = ops.mean(both * both, axis=-1, keep_dims=True)
        normed = (both * ops.rsqrt(var + self.input_layernorm.eps)).reshape(b, n, 2 * h)
        weight = ops.concat((self.input_layernorm.weight, self.hidden_norm.weight)).astype(ms.float32)
        return (normed * weight).astype(emb.dtype)


class RootPairStore(nn.Cell):
    """The draft's output at its last committed pair, kept in Parameters (never trained, not checkpoint
    content): token [B] i32 (the pair's token = the next tree's root), logprob [B,K] f32 and target_ids
    [B,K] i32 (its top-K), hidden [B,H] f32 (the depth-1 nodes' input feature)."""

    def __init__(self, batch: int, top_k: int, hidden: int):
        super().__init__()
        def param(name, shape, dtype):
            return Parameter(Tensor(np.zeros(shape, dtype)), name=name, requires_grad=False)
        self.token = param("token", (batch,), np.int32)
        self.logprob = param("logprob", (batch, top_k), np.float32)
        self.target_ids = param("target_ids", (batch, top_k), np.int32)
        self.hidden = param("hidden", (batch, hidden), np.float32)

    def keep(self, token, logprob, target_ids, hidden):
        """Overwrite the stored pair (side effects, kept and ordered by MindSpore's auto-monad even when
        the caller ignores them); returns the values written."""
        ops.assign(self.token, token)
        ops.assign(self.logprob, logprob)
        ops.assign(self.target_ids, target_ids)
        ops.assign(self.hidden, hidden)
        return token, logprob, target_ids, hidden

    def keep_row(self, input_ids, logprob, target_ids, hidden, last_row):
        """Keep row ``last_row`` [B] of an extend call's inputs/outputs ([B,N], [B,N,K], [B,N,K], [B,N,H])."""
        row = last_row.reshape(-1, 1).astype(ms.int32)                      # [B, 1]
        return self.keep(ops.gather(input_ids, row, 1, batch_dims=1)[:, 0].astype(ms.int32),
                         ops.gather(logprob, row, 1, batch_dims=1)[:, 0],
                         ops.gather(target_ids, row, 1, batch_dims=1)[:, 0],
                         ops.gather(hidden, row, 1, batch_dims=1)[:, 0])


class HalfMatrices(nn.Cell):
    """float16 copies of the draft's weight matrices (``Eagle3Draft.float_matrices``: fc, qkv, o, gate_up, down,
    lm_head; same shapes, tile-major order: eagle_ms/models/weight_tiles.py), read by the layer kernels in place
    of the float32 ones when the draft is built with ``kernel_weight_dtype`` 'float16'. Only for weights that
    are exactly float16 (the shipped draft is stored so; draft_weights.py ``load_draft_state`` checks, fills):
    the kernels widen each value back to the same float32, so their results are the same bits, and each draft
    depth streams half the bytes (docs/teacher_profile.md). Inference only; not checkpoint content."""

    NAMES = ("fc", "qkv", "o", "gate_up", "down", "lm_head")

    def __init__(self, shapes):
        super().__init__()
        for name, shape in zip(self.NAMES, shapes):
            setattr(self, name, Parameter(initializer("zeros", shape, ms.float16), name=f"kernel_half.{name}",
                                          requires_grad=False))

    def matrices(self):
        """The six Parameters in ``NAMES`` order."""
        return tuple(getattr(self, name) for name in self.NAMES)


class Eagle3Draft(nn.Cell):
    """The draft; ``construct`` is the ``extend`` graph (teacher features through fc).

    ``embed``: the teacher's embedding Parameter [V, H] to share, or None to own a frozen copy (set it
    with ``eagle_ms.draft_weights.load_draft_state(..., embed=array)``). ``top_k``: K of the in-graph top-k.
    ``capacity``: slots of the draft KV cache (committed region + scratch, see eagle_ms.eagle3_drafter).
    ``kernels``: 'composite' or 'cpu' (fused CPU kernels, eagle_ms/models/cpu_kernels.py; inference only).
    ``kernel_weight_dtype``: 'float16' = the layer kernels read float16 copies of the weight matrices
    (``HalfMatrices``; every weight loaded must then be exactly float16), 'float32' = the Parameters
    themselves. Only the layer kernels (kernels 'cpu' with eager attention) read them.
    """

    def __init__(self, cfg: Eagle3Config, batch: int, capacity: int, top_k: int, backend: str = "eager",
                 compute_dtype: str = "float32", embed: Parameter | None = None, kernels: str = "composite",
                 kernel_weight_dtype: str = "float32"):
        super().__init__()
        if kernel_weight_dtype not in ("float32", "float16"):
            raise ValueError(f"kernel_weight_dtype={kernel_weight_dtype!r} must be 'float32' or 'float16'")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= cfg.draft_vocab_size:
            raise ValueError(f"top_k={top_k!r} must be an integer in [1, draft_vocab_size={cfg.draft_vocab_size}]")
        dt = DTYPES[compute_dtype]
        self.config = cfg
        self.batch, self.capacity, self.top_k, self.backend = batch, capacity, top_k, backend
        self.kernels = kernels
        self.compute_dtype = compute_dtype
        h = cfg.hidden_size
        self.embed_tokens = nn.Cell()
        if embed is None:
            weight = Parameter(initializer("zeros", (cfg.vocab_size, h), dt), name="weight", requires_grad=False)
            self.shares_embedding = False
        else:
            if tuple(embed.shape) != (cfg.vocab_size, h):
                raise ValueError(f"shared embedding has shape {tuple(embed.shape)}, the draft needs "
                                 f"[vocab_size={cfg.vocab_size}, hidden_size={h}]")
            weight = embed
            self.shares_embedding = True
        self.embed_tokens.weight = weight
        self.fc = Linear(3 * cfg.target_hidden_size, h, False, dt)
        self.midlayer = DraftMidLayer(cfg, batch, capacity, backend, dt, kernels)
        self.norm = RMSNorm(h, cfg.rms_norm_eps, dt, kernels)
        self.lm_head = Linear(h, cfg.draft_vocab_size, False, dt)
        # target id = draft id + d2t[draft id]; zeros = identity (draft vocab == target vocab)
        self.d2t = Parameter(Tensor(np.zeros(cfg.draft_vocab_size, np.int32)), name="d2t", requires_grad=False)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)
        self.mask_backend = self.midlayer.self_attn.attn
        self.t2d = None  # host-side bool [V] (set by eagle_ms.draft_weights.load_draft_state); not in graphs
        self.root_pair = RootPairStore(batch, top_k, h)
        # kernels 'cpu': log-softmax, top-K and the target-id offsets in one kernel (cpu_kernels.LogSoftmaxTopK)
        self.fused_topk = fused_kernel(kernels, lambda: cpu_kernels.log_softmax_top_k_op(top_k))
        # kernels 'cpu' with attention over the cache in place: the layer as two kernels around the cache write
        # for the extend calls of at most KERNEL_EXTEND_ROWS rows and for the expand calls (``kernel_layer``)
        layer_kernels = self.midlayer.self_attn.window_in_place
        self.front_kernel = cpu_kernels.draft_front_op() if layer_kernels else None
        self.extend_front_kernel = cpu_kernels.draft_extend_front_op() if layer_kernels else None
        self.back_kernel = cpu_kernels.draft_back_op(top_k) if layer_kernels else None
        self.half_matrices = None
        if layer_kernels and kernel_weight_dtype == "float16":
            self.half_matrices = HalfMatrices([p.shape for p in self.float_matrices()])

    def construct(self, input_ids, features, position_ids, cache_slots, attn_mask, last_row=None, real_rows=None):
        """extend: features [B,N,3Ht] are teacher aux features (fc applied). Returns (logprob, ids, hidden).

        ``last_row`` [B] i32: also keep that row's token and outputs in ``root_pair`` (the drafter's
        extends pass it; without it nothing is kept). ``real_rows`` [B] i32: the rows before it are the
        committed pairs, the rest padding (default: ``last_row`` + 1, else all N). With the layer kernel
        (N <= KERNEL_EXTEND_ROWS) padding rows are not computed (their outputs are zeros, their scratch
        slots get zero K/V), and with ``last_row`` only that row's outputs are: every real row's K/V reaches
        the cache, the other rows' outputs are zeros. Otherwise every row is computed.
        """
        if self.kernel_extends(input_ids.shape[1]):
            if real_rows is None and last_row is not None:
                real_rows = last_row + 1
            (logprob, ids, hidden), _ = self.kernel_layer(True, input_ids, features, position_ids,
                                                          self.cache_rows(cache_slots), attn_mask, real_rows, last_row)
        else:
            feature = self.fc(features.astype(self.fc.weight.dtype))
            logprob, ids, hidden = self.step(input_ids, feature, position_ids, cache_slots, attn_mask)
        if last_row is not None:
            self.root_pair.keep_row(input_ids, logprob, ids, hidden, last_row)
        return logprob, ids, hidden

    def step(self, input_ids, feature, position_ids, cache_slots, attn_mask):
        """One cached draft step over N rows whose feature [B,N,H] is already in the draft's width.

        The returned hidden is fp32 (exact for fp16/bf16 compute; cast back when fed in again).
        """
        rows = flat_rows(cache_slots, self.config.num_key_value_heads, self.capacity)
        cos, sin = self.midlayer.self_attn.head_tables(*self.rotary(position_ids))
        hidden, normed = self.layer_rotated(input_ids, feature.astype(self.fc.weight.dtype), cos, sin, rows,
                                            attn_mask)
        logprob, ids = self.topk_normed(normed)
        return logprob, ids, hidden.astype(ms.float32)

    def layer_rotated(self, input_ids, feature, cos, sin, rows, attn_mask):
        """(pre-norm midlayer output hidden [B,N,H], the final norm of it [B,N,H]) with the rotary head tables
        given (``CachedAttention.head_tables``: [B,N,Hq+2Hkv,D], or [B,1,Hq+2Hkv,D] when every row has the
        same position: the tree step computes one per depth for all depths at once)."""
        mask = self.mask_backend.prepare_mask(attn_mask)
        normed_in = self.midlayer.embedded_inputs(self.embed_tokens.weight, input_ids, feature)
        h, mlp_out = self.midlayer(normed_in, feature, cos, sin, rows, mask)
        return self.norm.residual(h, mlp_out)

    def kernel_extends(self, rows: int) -> bool:
        """True when an extend call of ``rows`` rows runs the layer kernels (``kernel_layer``)."""
        return self.back_kernel is not None and rows <= KERNEL_EXTEND_ROWS

    def cache_rows(self, cache_slots):
        """cache_slots [B, N] -> the flat rows [B*N*Hkv] of the draft cache they name (``kv_cache.flat_rows``)."""
        return flat_rows(cache_slots, self.config.num_key_value_heads, self.capacity)

    def kernel_layer(self, extend: bool, input_ids, features, position_ids, cache_rows, attn_mask, real_rows=None,
                     first_row=None):
        """One draft call through the layer kernels (the 'cpu' kernels with attention over the cache in place):
        ``DraftExtendFront`` (extend: features [B,N,3Ht] through fc) or ``DraftFront`` (expand: features
        [B,N,H]), the rows' K/V written at the flat ``cache_rows`` (``cache_rows``), then ``DraftBack`` over the
        updated cache. Only the
        first ``real_rows`` [B] rows are computed (zeros for the rest; None: all N), and of them only rows from
        ``first_row`` [B] on get outputs (None: all; the K/V of every real row reach the cache). Returns
        ((logprob, ids, hidden) as ``step`` does, the updated caches (k, v) [B*Hkv*S, Dh]: reading them orders
        a read after the write)."""
        attn = self.midlayer.self_attn
        positions, inv_freq = position_ids.astype(ms.int32), self.rotary.inv_freq  # tables made in the kernel
        weights = self.kernel_weights()
        b, n = input_ids.shape
        ids = input_ids.astype(ms.int32)
        real = ops.ones((b,), ms.int32) * n if real_rows is None else real_rows.astype(ms.int32)
        if extend:
            fc = self.kernel_matrices()[0]
            q, k, v, feature = self.extend_front_kernel(ids, features.astype(ms.float32), positions, inv_freq,
                                                        real, fc, *weights)
        else:
            feature = features.astype(ms.float32)
            q, k, v = self.front_kernel(ids, feature, positions, inv_freq, real, *weights)
        caches = attn.kv_cache.write(k, v, cache_rows)
        first = ops.zeros((b,), ms.int32) if first_row is None else first_row.astype(ms.int32)
        return self.back_kernel(q, feature, attn_mask, real, first, *caches, *weights), caches

    def kernel_weights(self):
        """The weights as the draft kernels take them (eagle_ms/models/draft_kernels.cc ``kWeightInputs``):
        embedding, the two input norms, q/k/v and its (zero) bias, o, the post-attention norm, gate/up, down,
        the final norm, lm_head, d2t, eps [1], the score scale per KV head [Hkv]; the matrices as float16 copies
        with ``kernel_weight_dtype`` 'float16'."""
        mid, attn = self.midlayer, self.midlayer.self_attn
        _, qkv, o, gate_up, down, lm_head = self.kernel_matrices()
        return (self.embed_tokens.weight, mid.input_layernorm.weight, mid.hidden_norm.weight, qkv, attn.qkv_bias, o,
                mid.post_attention_layernorm.weight, gate_up, down, self.norm.weight, lm_head, self.d2t,
                mid.eps_tensor, attn.attn.kv_head_scales)

    def kernel_matrices(self):
        """The weight matrices the layer kernels read (``float_matrices`` order): the float16 copies with
        ``kernel_weight_dtype`` 'float16', else the float32 Parameters."""
        return self.float_matrices() if self.half_matrices is None else self.half_matrices.matrices()

    def float_matrices(self):
        """The weight matrices the layer kernels stream, as Parameters: fc [3Ht, H], qkv [2H, (Hq+2Hkv)D],
        o [Hq D, H], gate_up [H, 2I], down [I, H], lm_head [H, Vd] (``HalfMatrices.NAMES`` order)."""
        mid = self.midlayer
        return (self.fc.weight, mid.self_attn.qkv_proj.weight, mid.self_attn.o_proj.weight,
                mid.mlp.gate_up_proj.weight, mid.mlp.down_proj.weight, self.lm_head.weight)

    def logprobs(self, hidden):
        """hidden [B,N,H] -> log-softmax over the draft vocabulary [B,N,Vd] fp32."""
        return ops.log_softmax(self.lm_head(self.norm(hidden)).astype(ms.float32), axis=-1)  # [B,N,Vd]

    def topk_normed(self, normed):
        """normed [B,N,H] (the final norm's output) -> (top-K log-probs [B,N,K] fp32 descending, their TARGET
        ids [B,N,K] int32)."""
        logits = self.lm_head(normed).astype(ms.float32)  # [B,N,Vd]
        if self.fused_topk is not None:
            return self.fused_topk(logits, self.d2t)
        values, draft_ids = ops.topk(ops.log_softmax(logits, axis=-1), self.top_k, dim=-1, largest=True,
                                     sorted=True)
        draft_ids = draft_ids.astype(ms.int32)
        return values, draft_ids + ops.gather(self.d2t, draft_ids, 0)


class Eagle3Expand(nn.Cell):
    """The ``expand`` graph over the same weights and cache: features are the draft's own hidden [B,N,H].

    With the fused CPU kernels (the draft's ``kernels`` 'cpu', eager attention) the layer is two kernels around
    the cache write (``Eagle3Draft.kernel_layer``: the code the device tree kernel ``DraftTree`` runs per
    depth, so the host path's tree and the device tree are the same bits)."""

    def __init__(self, draft: Eagle3Draft):
        super().__init__(auto_prefix=False)  # never rename the draft's (or the shared teacher's) parameters
        self.draft = draft

    def construct(self, input_ids, hidden, position_ids, cache_slots, attn_mask):
        draft = self.draft
        if draft.back_kernel is None:
            return draft.step(input_ids, hidden, position_ids, cache_slots, attn_mask)
        return draft.kernel_layer(False, input_ids, hidden, position_ids, draft.cache_rows(cache_slots), attn_mask)[0]
