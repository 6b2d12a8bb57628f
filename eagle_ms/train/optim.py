"""Optimiser pieces shared by the teacher LM trainer and the EAGLE-3 draft trainer.

AdamW (MindSpore ``nn.AdamWeightDecay``) with linear warmup then cosine decay to ``min_lr_ratio``; the
compiled train step (loss, grad, global-norm clipping, update) is eagle_ms/models/training.py ``TrainStep``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn


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


def trainable(cell: nn.Cell) -> list[ms.Parameter]:
    """Trainable parameters (KV caches and frozen tensors have requires_grad=False)."""
    return [p for p in cell.trainable_params() if p.requires_grad]
