"""Pangu teacher (openPangu-Embedded architecture, Llama-like) as a MindSpore Cell.

Pre-norm RMSNorm, RoPE (rotate-half, ``rope_theta``), GQA, SwiGLU MLP without bias, q/k/v/o projections
with bias when ``bias`` is true, optional tied embeddings. Checkpoints use the HF keys
(``model.layers.{i}.self_attn.q_proj.weight`` ...); eagle_ms/models/param_layout.py maps each to its place
in a parameter: matrices are stored [in, out] and q/k/v and gate/up are packed (``qkv_proj``,
``gate_up_proj``; eagle_ms/models/layers.py).

One forward serves prefill chunks, single-token decode and tree verification:

    logits, aux = model(input_ids [B,N] int32, position_ids [B,N] int32,
                        cache_slots [B,N] int32, attn_mask [B,N,W] bool)

* K/V of the N tokens are written in place into the static cache at ``cache_slots`` before attention;
* ``attn_mask`` is the single mask source (True = may attend to that cache slot); its width W <= S
  selects the attention window: only cache slots [0, W) are read (one graph per (N, W));
* ``logits`` [B,N,V] fp32; ``aux`` [B,N,3H]: the hidden states *entering* layers ``aux_layer_ids``
  (EAGLE-3 low/mid/high features), concatenated in that order.

Graphs compile once per N (shapes are the only thing that varies); new values never recompile.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, nn, ops
from mindspore.common.initializer import Normal, initializer

from eagle_ms.models.kv_cache import CacheMover, flat_rows
from eagle_ms.config import ModelConfig
from eagle_ms.models.attention_layer import CachedAttention
from eagle_ms.models.layers import DTYPES, MLP, Linear, RMSNorm, Rotary


class DecoderLayer(nn.Cell):
    """Pre-norm decoder layer: x + attn(norm(x)); then + mlp(norm(.)).

    ``construct`` takes the input norm already applied and leaves the MLP residual add to the caller:
    the next layer's ``input_layernorm.residual`` (or the final norm's) adds it and norms the sum in one
    kernel with the 'cpu' kernels (``PanguForCausalLM.hidden_states``).
    """

    def __init__(self, cfg: ModelConfig, batch: int, capacity: int, backend: str, kernels: str):
        super().__init__()
        dt = DTYPES[cfg.compute_dtype]
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dt, kernels)
        self.self_attn = CachedAttention(cfg.hidden_size, cfg.hidden_size, cfg.num_attention_heads,
                                         cfg.num_key_value_heads, cfg.head_dim, cfg.bias, batch, capacity,
                                         backend, dt, kernels)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dt, kernels)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, dt, kernels)

    def construct(self, x, normed, cos, sin, rows, mask):
        """x [B,N,H] entering the layer, normed = input_layernorm(x) -> (x + attn, mlp out) [B,N,H] each: the
        layer's output is their sum."""
        attn = self.self_attn.o_proj.product(self.self_attn.attend(normed, cos, sin, rows, mask))
        if self.self_attn.o_proj.has_bias:
            x, h = self.post_attention_layernorm.residual(x, attn, self.self_attn.o_proj.bias)
        else:
            x, h = self.post_attention_layernorm.residual(x, attn)
        return x, self.mlp(h)


class PanguModel(nn.Cell):
    """Embedding, decoder stack, final norm (HF ``model.*``)."""

    def __init__(self, cfg: ModelConfig, batch: int, capacity: int, backend: str, kernels: str):
        super().__init__()
        dt = DTYPES[cfg.compute_dtype]
        self.embed_tokens = nn.Cell()
        self.embed_tokens.weight = Parameter(initializer(Normal(0.02), (cfg.vocab_size, cfg.hidden_size), dt),
                                             name="weight")
        self.layers = nn.CellList([DecoderLayer(cfg, batch, capacity, backend, kernels)
                                   for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dt, kernels)


class PanguForCausalLM(nn.Cell):
    """The teacher: ``construct`` as in the module doc. ``backend``: 'eager' or 'fused' attention;
    ``kernels``: 'composite' or 'cpu' (fused norm / SwiGLU / RoPE kernels, eagle_ms/models/cpu_kernels.py;
    inference only: they have no backward)."""

    def __init__(self, cfg: ModelConfig, batch: int, capacity: int, backend: str = "eager",
                 kernels: str = "composite"):
        super().__init__()
        self.config = cfg
        self.batch, self.capacity, self.backend, self.kernels = batch, capacity, backend, kernels
        dt = DTYPES[cfg.compute_dtype]
        self.model = PanguModel(cfg, batch, capacity, backend, kernels)
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, False, dt)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)
        self.mask_backend = self.model.layers[0].self_attn.attn
        self.aux_flags = tuple(i in cfg.aux_layer_ids for i in range(cfg.num_hidden_layers))
        self.num_layers = cfg.num_hidden_layers
        self.matmul_t = ops.MatMul(transpose_b=True)

    def caches(self) -> nn.CellList:
        return nn.CellList([layer.self_attn.kv_cache for layer in self.model.layers])

    def make_mover(self) -> CacheMover:
        """A graph that reorders this model's caches (commit by path)."""
        return CacheMover(self.caches(), self.config.num_key_value_heads, self.capacity)

    def construct(self, input_ids, position_ids, cache_slots, attn_mask):
        rows = flat_rows(cache_slots, self.config.num_key_value_heads, self.capacity)
        return self.forward(input_ids, position_ids, rows, attn_mask)

    def forward(self, input_ids, position_ids, rows, attn_mask):
        """The body of ``construct``; ``rows=None`` runs without the cache (attn_mask [B,N,N])."""
        hidden, aux = self.hidden_states(input_ids, position_ids, rows, attn_mask)
        return self.lm_logits(hidden), aux

    def hidden_states(self, input_ids, position_ids, rows, attn_mask):
        """(final-norm hidden [B,N,H] in the compute dtype, aux [B,N,3H]); arguments as ``forward``."""
        x = ops.gather(self.model.embed_tokens.weight, input_ids, 0)  # [B, N, H]
        cos, sin = self.model.layers[0].self_attn.head_tables(*self.rotary(position_ids))  # shared by all layers
        mask = self.mask_backend.prepare_mask(attn_mask)
        aux = ()
        layers = self.model.layers
        normed = layers[0].input_layernorm(x)
        for i, layer in enumerate(layers):
            if self.aux_flags[i]:
                aux = aux + (x,)
            x, delta = layer(x, normed, cos, sin, rows, mask)
            # the MLP residual add and the next norm in one step (DecoderLayer doc)
            if i + 1 < self.num_layers:
                x, normed = layers[i + 1].input_layernorm.residual(x, delta)
            else:
                x, normed = self.model.norm.residual(x, delta)
        return normed, ops.concat(aux, axis=-1)

    def lm_logits(self, hidden):
        """hidden [B,N,H] (final-norm) -> logits [B,N,V] fp32 through the (possibly tied) lm_head."""
        if not self.config.tie_word_embeddings:
            return self.lm_head(hidden).astype(ms.float32)  # lm_head stored [H, V]
        b, n, _ = hidden.shape
        return self.matmul_t(hidden.reshape(b * n, -1), self.model.embed_tokens.weight).astype(ms.float32).reshape(b, n, -1)


class PanguFullSequence(nn.Cell):
    """Cache-free forward of a teacher over whole sequences (training, feature extraction).

    construct(input_ids [B,T] int32, position_ids [B,T] int32, attn_mask [B,T,T] bool) -> (logits, aux).
    Shares the teacher's parameters; never touches its KV cache.
    """

    def __init__(self, teacher: PanguForCausalLM):
        super().__init__()
        self.teacher = teacher

    def construct(self, input_ids, position_ids, attn_mask):
        return self.teacher.forward(input_ids, position_ids, None, attn_mask)
