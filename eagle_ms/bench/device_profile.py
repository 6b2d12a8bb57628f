"""Kernel profile of the device step's graphs (scripts/profile_device_step.py, docs/teacher_profile.md).

After a ``context``-token prefill of random ids (the teacher cache; the draft's own cache stays as the
drafter's ``begin`` left it: the kernel count does not depend on values), warm calls of:

* ``draft_tree``: the tree part of ``DraftTreeStep`` (all depths, rerank, tree tensors) from the stored
  root pair (eagle_ms/bench/device_draft_timing.py ``TreeOnly``);
* ``draft_step``: the whole ``DraftTreeStep`` call (extend of A + 1 pairs, then the tree), A = Dmax;
* ``verify``: ``VerifyStep`` over a budget-sized tree (forward, accept; the commit is a separate call);
* ``decode``: ``DecodeStep`` (a teacher-only token).

Each is ``graph_profile.summarize_calls`` of ``calls`` profiled calls: launched kernels, kernel time,
span, dispatch gap, kernels by op type. Calls repeat the same inputs, so the caches see the same writes.
"""
from __future__ import annotations

import numpy as np

from eagle_ms.bench.graph_profile import profile_call
from eagle_ms.bench.verify_timing import probe_trees
from eagle_ms.device_verify import TreeInputs

GRAPHS = ("draft_tree", "draft_step", "verify", "decode")


def profile_device_step(session, context: int, calls: int, seed: int = 0) -> dict:
    """{graph: summarize_calls(...)} for ``GRAPHS`` (module doc); ``session`` built with step: device."""
    from mindspore import Tensor

    from eagle_ms.bench.device_draft_timing import TreeOnly
    from eagle_ms.models.draft_tree_step import result_width

    if session.device_tree is None:
        raise ValueError("the device-step profile needs speculative.step: device and speculative.draft: eagle3")
    rng = np.random.default_rng(seed)
    runner, settings = session.runner, session.settings
    d = settings.max_depth
    prompt = rng.integers(0, runner.vocab_size, context).astype(np.int32)
    runner.prefill(prompt)
    length = runner.length
    trees = probe_trees(runner, settings.budget, d, int(prompt[-1]), rng)
    inputs = TreeInputs.from_tree(trees["in_order"])
    verifier = session.verifier(settings.sampling)
    window = runner.attention_width(length + inputs.num_nodes)
    verify_graph, decode_graph = verifier.verify_step(window, inputs.num_nodes), verifier.decode_steps[window]
    draft_graph = session.device_tree.graph(session.device_tree.window(length + d + 1))
    tree_only = TreeOnly(draft_graph)
    result = np.zeros((1, result_width(d)), np.int32)
    result[0, 0] = d                                                       # A = Dmax: every extend row real
    result[0, 1:d + 2] = rng.integers(0, runner.vocab_size, d + 1)
    aux = Tensor(rng.standard_normal((1, d + 1, verifier.aux_width)).astype(np.float32))
    result, committed = Tensor(result), Tensor(np.array([length], np.int32))
    root = Tensor(np.array([[int(prompt[-1])]], np.int32))
    grown = Tensor(np.array([length + d + 1], np.int32))
    calls_of = {
        "draft_tree": lambda: tree_only(grown)[10].asnumpy(),
        "draft_step": lambda: draft_graph(result, aux, committed)[10].asnumpy(),
        "verify": lambda: verify_graph(inputs.tokens, inputs.position_ids, inputs.tree_mask, inputs.paths,
                                       inputs.path_lengths, committed)[0].asnumpy(),
        "decode": lambda: decode_graph(root, committed)[0].asnumpy(),
    }
    return {name: profile_call(call, calls) for name, call in calls_of.items()}
