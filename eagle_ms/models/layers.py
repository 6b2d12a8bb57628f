"""Building blocks of the Pangu teacher and the EAGLE-3 draft (Llama family).

Matrices are stored **[in, out]**, the transpose of the HF checkpoint's ``Linear.weight`` [out, in], and
projections that read the same input are packed into one matrix (``FusedLinear``: q/k/v, gate/up).
Checkpoints keep the HF keys and layout: ``eagle_ms/models/param_layout.py`` maps every HF tensor to its
place in a parameter (tested against the HF layout in tests/test_param_layout.py). Why: one matmul
instead of three, no ``transpose_b`` (MindSpore's CPU MatMul is faster on an untransposed right-hand
side at these shapes), and 6 fewer kernels per attention layer (docs/teacher_profile.md).
Norms and softmax are computed in fp32; matmuls in the configured compute dtype.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, Zero, initializer

from eagle_ms.models import cpu_kernels

DTYPES = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}


def fused_kernel(kernels: str, make):
    """``make()`` (a ``cpu_kernels`` operator) when ``kernels`` is 'cpu', None for 'composite'."""
    if kernels not in ("composite", "cpu"):
        raise ValueError(f"kernels {kernels!r}: must be 'composite' or 'cpu'")
    return make() if kernels == "cpu" else None


class FusedLinear(nn.Cell):
    """Linear layers over the same input as one matmul: y = x @ W (+ b), x [..., in] -> y [..., sum(outs)].

    ``parts`` = ((hf_name, out), ...), e.g. (("q_proj", 256), ("k_proj", 128), ("v_proj", 128)): part p is
    columns [offset_p, offset_p + out_p) of W [in, sum(outs)] and of b; its HF key is
    ``<parent>.<hf_name>.weight`` [out_p, in] (``param_layout``). The caller splits the output.
    """

    def __init__(self, in_features: int, parts: tuple[tuple[str, int], ...], bias: bool, dtype=ms.float32,
                 std: float = 0.02):
        super().__init__()
        self.parts = tuple((str(name), int(out)) for name, out in parts)
        self.in_features = in_features
        self.out_features = sum(out for _, out in self.parts)
        self.weight = Parameter(initializer(Normal(std), (in_features, self.out_features), dtype), name="weight")
        self.has_bias = bias
        if bias:
            self.bias = Parameter(initializer(Zero(), (self.out_features,), dtype), name="bias")
        self.matmul = ops.MatMul()

    def construct(self, x):
        y = self.product(x)
        return y + self.bias if self.has_bias else y

    def product(self, x):
        """x @ W without the bias: [..., in] -> [..., sum(outs)] (for kernels that add the bias themselves)."""
        return self.matmul(x.reshape(-1, self.in_features), self.weight).reshape(x.shape[:-1] + (self.out_features,))


class Linear(FusedLinear):
    """y = x @ W (+ b), x [..., in] -> y [..., out]: a ``FusedLinear`` of one part, whose HF key is the
    Cell's own (``<path>.weight`` [out, in])."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype=ms.float32, std: float = 0.02):
        super().__init__(in_features, (("", out_features),), bias, dtype, std)


class RMSNorm(nn.Cell):
    """x * rsqrt(mean(x^2) + eps) * w, computed in fp32, returned in x's dtype.

    ``kernels``: 'composite' (MindSpore ops) or 'cpu' (one fused kernel, eagle_ms/models/cpu_kernels.py).
    """

    def __init__(self, dim: int, eps: float, dtype=ms.float32, kernels: str = "composite"):
        super().__init__()
        self.weight = Parameter(initializer("ones", (dim,), dtype), name="weight")
        self.eps = eps
        self.fused = fused_kernel(kernels, cpu_kernels.rms_norm_op)
        self.fused_add = fused_kernel(kernels, cpu_kernels.add_rms_norm_op)
        self.eps_tensor = Tensor(np.array([eps], np.float32))
        self.no_bias = Tensor(np.zeros(dim, np.float32))

    def residual(self, x, delta, bias=None):
        """(s, norm(s)) with s = x + (delta + bias) (bias [dim] or None): a residual add, then this pre-norm.
        With the 'cpu' kernels one kernel (``cpu_kernels.AddRmsNorm``), else the adds and ``construct``."""
        if self.fused_add is not None:
            if bias is None:
                return self.fused_add(x, delta, self.no_bias, self.weight, self.eps_tensor)
            return self.fused_add(x, delta, bias, self.weight, self.eps_tensor)
        s = x + delta if bias is None else x + (delta + bias)
        return s, self.construct(s)

    def construct(self, x):
        if self.fused is not None:
            return self.fused(x, self.weight, self.eps_tensor)
        xf = x.astype(ms.float32)
        var = ops.mean(xf * xf, axis=-1, keep_dims=True)
        y = xf * ops.rsqrt(var + self.eps)
        return (y * self.weight.astype(ms.float32)).astype(x.dtype)


class MLP(nn.Cell):
    """SwiGLU: down(silu(gate(x)) * up(x)), no bias; gate and up packed as ``gate_up_proj`` [H, 2I]."""

    def __init__(self, hidden: int, intermediate: int, dtype=ms.float32, kernels: str = "composite"):
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = FusedLinear(hidden, (("gate_proj", intermediate), ("up_proj", intermediate)), False, dtype)
        self.down_proj = Linear(intermediate, hidden, False, dtype)
        self.fused = fused_kernel(kernels, cpu_kernels.silu_mul_op)

    def construct(self, x):
        if self.fused is not None:
            return self.down_proj(self.fused(self.gate_up_proj(x)))
        gate, up = ops.split(self.gate_up_proj(x), self.intermediate, -1)
        return self.down_proj(ops.silu(gate) * up)


def rope_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """inv_freq [head_dim/2] = theta^(-2i/head_dim), float64 then float32 (as HF computes it)."""
    return (1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))).astype(np.float32)


class Rotary(nn.Cell):
    """Rotary embedding tables, rotate-half convention: position_ids [B, N] -> (cos, sin) [B, 1, N, D].

    ``sin`` carries rotate-half's sign: its first D/2 entries are negated, so that ``apply_rope`` needs
    only a swap of the two halves (no negation, no concat). Worked example (D=4, one position, angles
    a0, a1): cos = [cos a0, cos a1, cos a0, cos a1], sin = [-sin a0, -sin a1, sin a0, sin a1].
    """

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.inv_freq = Tensor(rope_inv_freq(head_dim, theta))  # constant, not a Parameter (not saved)
        half = head_dim // 2
        self.sign = Tensor(np.concatenate([-np.ones(half), np.ones(half)]).astype(np.float32))  # [D]

    def construct(self, position_ids):
        freqs = position_ids.astype(ms.float32).expand_dims(-1) * self.inv_freq  # [B, N, D/2]
        emb = ops.concat((freqs, freqs), axis=-1).expand_dims(1)  # [B, 1, N, D]
        return ops.cos(emb), ops.sin(emb) * self.sign


def half_swap_index(head_dim: int) -> np.ndarray:
    """[D] int32 gather index of ``swap_halves``: [D/2 .. D-1, 0 .. D/2-1]. Example: 4 -> [2, 3, 0, 1]."""
    return np.roll(np.arange(head_dim, dtype=np.int32), head_dim // 2)


def swap_halves(x, index):
    """[..., D] -> [..., D] with the two halves exchanged: [x1, x2] -> [x2, x1]; ``index`` = Tensor of
    ``half_swap_index(D)``. One Gather over the last axis: MindSpore's CPU ``ReverseV2`` (an ``ops.flip`` of
    [..., 2, D/2]) took 0.16 ms per call at 33 rows x 8 heads, the gather a fraction of it
    (docs/teacher_profile.md §"Where a device step's time goes").

    Worked example: [1, 2, 3, 4] -> [3, 4, 1, 2].
    """
    return ops.gather(x, index, x.ndim - 1)


def apply_rope(x, cos, sin, swap_index):
    """x [..., D] rotated by position: x*cos + rotate_half(x)*sin_plain (fp32 math); cos/sin broadcast
    to x (``Rotary``'s [B, 1, N, D] for x [B, H, N, D], or reshaped [B, N, 1, D] for x [B, N, H, D]);
    ``swap_index``: see ``swap_halves``.

    With ``Rotary``'s signed sin, rotate_half(x)*sin_plain = [-x2, x1]*sin_plain = swap_halves(x)*sin:
    the same products, so the same values.
    """
    xf = x.astype(ms.float32)
    return (xf * cos + swap_halves(xf, swap_index) * sin).astype(x.dtype)
