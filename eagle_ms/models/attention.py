"""Attention backends over the static KV cache, with one mask source.

The single mask source is a bool tensor ``allowed [B, N, S]`` (True = query row may attend to cache
slot), built on the host by ``eagle_ms.tree.verify_attention_mask`` (tree verify) or
``eagle_ms.teacher.causal_chunk_mask`` (prefill / decode). A backend converts it ONCE per forward at
the op boundary (``prepare_mask``) and every layer then calls ``attend`` with the converted mask:

* ``EagerAttention``: matmul + softmax on any device; additive fp32 mask (0 keep / -1e30 drop). With the
  'cpu' kernels, attention over the cache window is one kernel reading the cache in place (``over_cache``),
  and over the rows themselves (no cache) the scale, mask and softmax are one kernel
  (eagle_ms/models/cpu_kernels.py).
* ``FusedAttention``: Ascend ``ops.flash_attention_score`` (layout BNSD, GQA through ``head_num``,
  ``scalar_value`` = 1/sqrt(head_dim)); its mask is uint8 with **1 = discard**, shape [B, 1, N, S].
  The fused op only exists on Ascend (Atlas A2); on CPU its wiring is tested by patching a NumPy
  emulation of the documented semantics in place of the op (tests/test_attention_backends.py).

Rows whose ``allowed`` row is empty cannot occur: callers keep every row open on at least itself.
"""
from __future__ import annotations

import os

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops

from eagle_ms.models import cpu_kernels
from eagle_ms.models.layers import fused_kernel

NEG_INF = -1e30  # additive mask value; softmax is computed in fp32 so this underflows to exactly 0

ENV_FORCE_EAGER = "EAGLE_MS_FORCE_EAGER_ATTN"  # "1": eager attention everywhere
ENV_DISABLE_FUSED_TREE = "EAGLE_MS_DISABLE_FUSED_TREE"  # "1": eager attention for tree verify graphs


class EagerAttention(nn.Cell):
    """Scaled dot-product attention with GQA by head grouping (no K/V repetition).

    Query head ``h`` uses KV head ``h // (num_heads // num_kv_heads)`` (the HF ``repeat_kv`` convention).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, kernels: str = "composite"):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.groups = num_heads // num_kv_heads
        self.scale = 1.0 / (head_dim ** 0.5)
        self.head_dim = head_dim
        self.scores_matmul = ops.BatchMatMul(transpose_b=True)  # q k^T without materialising k^T
        # kernels 'cpu': scale, mask and softmax in one kernel (cpu_kernels.MaskedSoftmax)
        self.masked_softmax = fused_kernel(kernels, cpu_kernels.masked_softmax_op)
        self.scale_tensor = Tensor(np.array([self.scale], np.float32))
        # kernels 'cpu': attention over the cache window in one kernel, reading the cache in place
        self.window_attention = fused_kernel(kernels, cpu_kernels.window_attention_op)
        self.kv_head_scales = Tensor(np.full(num_kv_heads, self.scale, np.float32))  # its length tells the kernel Hkv

    def prepare_mask(self, allowed):
        """allowed [B, N, S] bool -> the mask the layers get: with the 'cpu' kernels ``allowed`` itself
        (``over_cache`` reads it as is, so no kernel converts it; ``construct`` converts it when a layer
        attends without the cache), else ``additive(allowed)``."""
        if self.window_attention is not None:
            return allowed
        return self.additive(allowed)

    @staticmethod
    def additive(allowed):
        """allowed [B, N, S] bool -> additive fp32 mask [B, 1, 1, N, S] (0 keep, NEG_INF drop)."""
        # (1 - keep) * NEG_INF, not one ops.where(allowed, 0, NEG_INF): that form segfaulted MindSpore 2.9's
        # compile of the teacher training graph (tests/test_teacher_lm.py); the cause was not investigated
        keep = allowed.astype(ms.float32)
        additive = (1.0 - keep) * NEG_INF
        return additive.expand_dims(1).expand_dims(1)

    def construct(self, q, k, v, mask):
        """q [B, Hq, N, D]; k, v [B, Hkv, S, D]; mask from prepare_mask -> out [B, N, Hq*D]."""
        if mask.dtype == ms.bool_:  # the 'cpu' kernels' prepare_mask leaves it bool (dtype: static in a graph)
            mask = self.additive(mask)
        b, _, n, d = q.shape
        s = k.shape[2]
        qg = q.reshape(b, self.num_kv_heads, self.groups * n, d)  # [B, Hkv, G*N, D]
        if self.masked_softmax is not None:
            probs = self.masked_softmax(self.scores_matmul(qg, k), mask, self.scale_tensor)  # [B, Hkv, G*N, S]
        else:
            scores = self.scores_matmul(qg, k).astype(ms.float32) * self.scale  # [B, Hkv, G*N, S]
            scores = scores.reshape(b, self.num_kv_heads, self.groups, n, s) + mask
            probs = ops.softmax(scores, axis=-1).astype(v.dtype)
            probs = probs.reshape(b, self.num_kv_heads, self.groups * n, s)
        out = ops.matmul(probs, v)  # [B, Hkv, G*N, D]
        out = out.reshape(b, self.num_heads, n, d).swapaxes(1, 2)  # [B, N, Hq, D]
        return out.reshape(b, n, self.num_heads * d)


    def over_cache(self, q, k_cache, v_cache, mask):
        """With the 'cpu' kernels only: q [B, Hq, N, D]; k_cache, v_cache the flat caches [B*Hkv*S, D]
        (``KVCache.write``); mask from prepare_mask (bool [B, N, W]) -> out [B, N, Hq*D] over slots [0, W)."""
        return self.window_attention(q, k_cache, v_cache, mask, self.kv_head_scales)


class FusedAttention(nn.Cell):
    """Ascend FlashAttentionScore with an explicit [B, 1, N, S] discard mask (sparse_mode 0)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads = num_heads
        self.scale = 1.0 / (head_dim ** 0.5)

    def prepare_mask(self, allowed):
        """allowed [B, N, S] bool -> uint8 [B, 1, N, S] with 1 = discard (FlashAttentionScore convention)."""
        return ops.logical_not(allowed).astype(ms.uint8).expand_dims(1)

    def construct(self, q, k, v, mask):
        """q [B, Hq, N, D]; k, v [B, Hkv, S, D] -> out [B, N, Hq*D] in q's dtype.

        The op takes only fp16/bf16: fp32 inputs are cast to fp16 for the call and the output back.
        """
        b, _, n, d = q.shape
        dtype = q.dtype
        if dtype == ms.float32:
            q, k, v = q.astype(ms.float16), k.astype(ms.float16), v.astype(ms.float16)
        out = ops.flash_attention_score(q, k, v, self.num_heads, attn_mask=mask, scalar_value=self.scale,
                                        input_layout="BNSD")  # [B, Hq, N, D]
        return out.astype(dtype).swapaxes(1, 2).reshape(b, n, self.num_heads * d)


def choose_backend(mode: str, device: str, tree: bool = False) -> str:
    """'eager' or 'fused' for a graph, by decode mode, device and the documented env overrides.

    reference mode is always eager; performance mode is fused only where the device has the op (Ascend).
    ``EAGLE_MS_FORCE_EAGER_ATTN=1`` forces eager; ``EAGLE_MS_DISABLE_FUSED_TREE=1`` forces eager for
    tree-verify graphs only.
    """
    if os.environ.get(ENV_FORCE_EAGER) == "1":
        return "eager"
    if tree and os.environ.get(ENV_DISABLE_FUSED_TREE) == "1":
        return "eager"
    if mode == "performance" and device == "Ascend":
        return "fused"
    return "eager"


def make_attention(backend: str, num_heads: int, num_kv_heads: int, head_dim: int,
                   kernels: str = "composite") -> nn.Cell:
    """The attention Cell of ``backend``; ``kernels`` applies to 'eager' (the 'fused' op is already one
    kernel)."""
    if backend == "eager":
        return EagerAttention(num_heads, num_kv_heads, head_dim, kernels)
    if backend == "fused":
        return FusedAttention(num_heads, num_kv_heads, head_dim)
    raise ValueError(f"attention backend {backend!r}: must be 'eager' or 'fused'")
