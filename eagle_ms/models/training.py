"""Training-time graphs of the teacher and the generic train step (inference never builds these).

* ``TrainStep``: loss, grad, (data-parallel gradient reduction), global-norm clipping and the optimiser
  update in one compiled graph (the teacher LM trainer).
* ``AccumulateGrads``, ``ApplySums``: the same step cut in two graphs, so that the gradients of several
  micro-batches can be summed before one update (the EAGLE-3 draft trainer's ``--micro-batch``). The sum
  lives in Parameters updated in place; no gradient tensor leaves a graph. (Returning the gradients from
  one graph and feeding them to the next grew the resident memory by every step's inputs and gradients,
  MindSpore 2.9 CPU: 3.7 MB per step on the tests' tiny draft, ~70 MB on the demo draft at 1 280 tokens.)
* ``CausalLMLoss``, ``CausalLMTokenLoss``: the teacher's next-token cross entropy over fixed windows, mean
  and per token (held-out loss by position band; eagle_ms/train/teacher_lm.py).
* ``TeacherFeatureNet``: the teacher's cache-free forward without the lm_head, the features of draft
  training (eagle_ms/train/preprocess.py).
"""
from __future__ import annotations

import numpy as np

from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from eagle_ms.models.pangu import PanguForCausalLM, PanguFullSequence


class ApplyGrads(nn.Cell):
    """construct(grads) -> the optimiser's result: (data-parallel mean,) global-norm clip, update.

    ``grad_reducer`` (optional) averages gradients across data-parallel ranks before clipping.
    """

    def __init__(self, optimizer: nn.Optimizer, grad_clip: float, grad_reducer=None):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer
        self.grad_clip = grad_clip
        self.grad_reducer = grad_reducer if grad_reducer is not None else ops.identity

    def construct(self, grads):
        grads = self.grad_reducer(grads)
        grads = ops.clip_by_global_norm(grads, self.grad_clip)
        return self.optimizer(grads)


class TrainStep(nn.Cell):
    """loss, grad, clip, update in one graph: construct(*batch) -> loss (scalar fp32).

    ``loss_net(*batch)`` returns a scalar loss; ``grad_reducer``: see ``ApplyGrads``.
    """

    def __init__(self, loss_net: nn.Cell, optimizer: nn.Optimizer, grad_clip: float, grad_reducer=None):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net
        self.grad_fn = ops.value_and_grad(loss_net, None, optimizer.parameters)
        self.apply_grads = ApplyGrads(optimizer, grad_clip, grad_reducer)

    def construct(self, *batch):
        loss, grads = self.grad_fn(*batch)
        return ops.depend(loss, self.apply_grads(grads))


class ApplySums(nn.Cell):
    """construct() -> ``ApplyGrads`` of ``AccumulateGrads.sums`` (read in the graph: Parameters are not
    passed as call arguments)."""

    def __init__(self, sums: ParameterTuple, apply_grads: ApplyGrads):
        super().__init__(auto_prefix=False)
        self.sums = sums
        self.apply_grads = apply_grads

    def construct(self):
        return self.apply_grads(self.sums)


class AccumulateGrads(nn.Cell):
    """construct(first [] bool, *batch) -> loss; ``sums`` (one Parameter per weight, in place) becomes
    grads(loss_net(*batch)) when ``first``, else sums + grads. ``sums`` is what ``ApplyGrads`` applies."""

    def __init__(self, loss_net: nn.Cell, weights):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net
        self.grad_fn = ops.value_and_grad(loss_net, None, weights)
        self.sums = ParameterTuple(Parameter(np.zeros(w.shape, np.float32), name=f"grad_sum.{w.name}",
                                             requires_grad=False) for w in weights)

    def construct(self, first, *batch):
        loss, grads = self.grad_fn(*batch)
        done = ()
        for total, grad in zip(self.sums, grads):
            done += (ops.assign(total, ops.select(first, grad, total + grad)),)
        return ops.depend(loss, done)


class CausalLMLoss(nn.Cell):
    """Mean next-token cross entropy: construct(input_ids [B,T], labels [B,T]) -> scalar fp32."""

    def __init__(self, teacher: PanguForCausalLM, seq_len: int):
        super().__init__()
        self.full = PanguFullSequence(teacher)
        self.positions = Tensor(np.arange(seq_len, dtype=np.int32)[None])  # [1, T], broadcast over B
        self.mask = Tensor(np.tril(np.ones((seq_len, seq_len), dtype=bool))[None])  # [1, T, T] causal

    def construct(self, input_ids, labels):
        logits, _ = self.full(input_ids, self.positions, self.mask)
        vocab = logits.shape[-1]
        return ops.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))


class CausalLMTokenLoss(nn.Cell):
    """Per-token next-token cross entropy: construct(input_ids [B,T], labels [B,T]) -> [B,T] fp32."""

    def __init__(self, teacher: PanguForCausalLM, seq_len: int):
        super().__init__()
        self.full = PanguFullSequence(teacher)
        self.positions = Tensor(np.arange(seq_len, dtype=np.int32)[None])
        self.mask = Tensor(np.tril(np.ones((seq_len, seq_len), dtype=bool))[None])

    def construct(self, input_ids, labels):
        logits, _ = self.full(input_ids, self.positions, self.mask)
        vocab = logits.shape[-1]
        losses = ops.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), reduction="none")
        return losses.reshape(labels.shape)


class TeacherFeatureNet(nn.Cell):
    """construct(input_ids [1,T], position_ids [1,T], attn_mask [1,T,T] bool) -> (hidden [1,T,H], aux [1,T,3H]).

    The teacher's cache-free forward without the lm_head (its parameters are shared, never copied).
    """

    def __init__(self, teacher):
        super().__init__()
        self.teacher = teacher

    def construct(self, input_ids, position_ids, attn_mask):
        return self.teacher.hidden_states(input_ids, position_ids, None, attn_mask)
