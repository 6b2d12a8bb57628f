"""Optimiser pieces shared by the teacher LM trainer and the EAGLE-3 draft trainer.

AdamW (MindSpore ``nn.AdamWeightDecay``) with linear warmup then cosine decay to ``min_lr_ratio``,
global-norm gradient clipping, and one compiled train step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    total_steps: int = 10000
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0

    def __post_init__(self):
        for name in ("lr", "beta1", "beta2", "grad_clip"):
            if not getattr(self, name) > 0:
                raise ValueError(f"optim.{name} = {getattr(self, name)!r}: must be > 0")
        if self.total_steps < 1 or self.warmup_steps < 0:
            raise ValueError(f"optim.total_steps {self.total_steps} must be >= 1 and warmup_steps "
                             f"{self.warmup_steps} >= 0")


def lr_schedule(cfg: OptimConfig) -> np.ndarray:
    """Per-step learning rates [total_steps]: linear warmup from 0, cosine decay to lr*min_lr_ratio."""
    steps = np.arange(cfg.total_steps, dtype=np.float64)
    warm = max(cfg.warmup_steps, 1)
    progress = np.clip((steps - cfg.warmup_steps) / max(cfg.total_steps - cfg.warmup_steps, 1), 0.0, 1.0)
    cosine = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + np.cos(math.pi * progress))
    lr = np.where(steps < cfg.warmup_steps, (steps + 1) / warm, cosine) * cfg.lr
    return lr.astype(np.float32)


def make_optimizer(params, cfg: OptimConfig) -> nn.Optimizer:
    """AdamW over ``params``; norms and biases are not decayed (names ending in norm weights or .bias)."""
    params = list(params)
    no_decay = [p for p in params if p.ndim < 2]
    decay = [p for p in params if p.ndim >= 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    return nn.AdamWeightDecay(groups, learning_rate=Tensor(lr_schedule(cfg)), beta1=cfg.beta1, beta2=cfg.beta2,
                              eps=1e-8)


class TrainStep(nn.Cell):
    """loss, grad, clip, update in one graph: construct(*batch) -> loss (scalar fp32).

    ``loss_net(*batch)`` returns a scalar loss; ``grad_reducer`` (optional) averages gradients across
    data-parallel ranks before clipping.
    """

    def __init__(self, loss_net: nn.Cell, optimizer: nn.Optimizer, grad_clip: float, grad_reducer=None):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad_fn = ops.value_and_grad(loss_net, None, self.weights)
        self.grad_clip = grad_clip
        self.grad_reducer = grad_reducer if grad_reducer is not None else ops.identity

    def construct(self, *batch):
        loss, grads = self.grad_fn(*batch)
        grads = self.grad_reducer(grads)
        grads = ops.clip_by_global_norm(grads, self.grad_clip)
        loss = ops.depend(loss, self.optimizer(grads))
        return loss


def trainable(cell: nn.Cell) -> list[ms.Parameter]:
    """Trainable parameters (KV caches and frozen tensors have requires_grad=False)."""
    return [p for p in cell.trainable_params() if p.requires_grad]
