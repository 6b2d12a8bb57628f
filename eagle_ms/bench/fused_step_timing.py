"""The fused draft+verify graph against the device step's two graph calls (scripts/time_fused_step.py).

Issue #15 asks whether fusing the draft graph (``DraftTreeStep``) and the verify graph (``VerifyStep``)
into one call is faster. ``FusedTreeStep`` (eagle_ms/models/fused_step.py, what ``speculative.step:
fused`` runs) is that graph: the previous step's packed result and accepted aux rows in, the next result
and aux rows out, the draft tree's tensors never leaving the graph. The two-call device step
(eagle_ms/device_step.py) passes the same tree tensors between its calls as device tensors, so the fused
form can only save one graph launch and the host's hand-over.

``fused_vs_two_calls`` runs ``warm_steps`` greedy device steps (``DeviceSteps``, two calls each), then
times, from that state, the two arms on the same inputs in alternated rounds (medians); both use the
window the product uses, ``attention_width(L' + N)``, for the draft and the verify half:

  two_calls  the window's DraftTreeStep, then the window's VerifyStep on its outputs, then the host read of
             the packed result (what a device step does, without its host bookkeeping)
  fused      one FusedTreeStep call, then the same host read
  decode     the window's DecodeStep (a teacher-only token at the same L', its root the previous step's
             bonus token), then its host read: the unit of the speedup bars (``fused_over_decode``)

Repeating a call is exact: it rewrites the same cache slots and root pair with the same values (the
decode writes slot L', which the verify half rewrites before reading it). The two drafted arms must return
the same packed result (checked on every call).
"""
from __future__ import annotations

import time

import numpy as np

from mindspore import Tensor

from eagle_ms.device_drafter import DeviceTreeDrafter
from eagle_ms.device_step import DeviceSteps
from eagle_ms.device_verify import DeviceVerifier
from eagle_ms.generate import DecodeSettings
from eagle_ms.models.fused_step import PATH_LENGTHS, PATHS, POSITION_IDS, TOKENS, TREE_MASK, FusedTreeStep
from eagle_ms.models.step_result import unpack_result


def state_after_steps(verifier: DeviceVerifier, device_tree: DeviceTreeDrafter, prompt_ids, warm_steps: int):
    """``warm_steps`` greedy device steps (eagle_ms/device_step.py, two graph calls each); returns
    (result, accepted_aux, L_prev, L'): the next draft call's inputs and the teacher's committed length."""
    verifier.runner.reset()
    d = verifier.max_depth
    steps = DeviceSteps(verifier, device_tree, DecodeSettings(budget=device_tree.params.budget, max_depth=d))
    root, _ = steps.start(np.asarray(prompt_ids, np.int32))
    for _ in range(warm_steps):
        root = int(steps.step(root, speculate=True).tokens[-1])
    result, accepted_aux, prev, _ = steps.draft_inputs()
    return result, accepted_aux, prev, verifier.runner.length


def fused_vs_two_calls(verifier: DeviceVerifier, device_tree: DeviceTreeDrafter, prompt_ids, warm_steps: int,
                       repeats: int, rounds: int) -> dict:
    """Times of the two arms (module doc) from the state after ``warm_steps`` steps of ``prompt_ids``.

    Returns {context, draft_window, verify_window, two_calls_ms, fused_ms, decode_ms (medians),
    fused_over_two_calls, fused_over_decode, fused_compile_s, results_equal}. Raises ValueError if
    ``warm_steps`` < 1 or the state leaves no room for one more tree."""
    if warm_steps < 1:
        raise ValueError(f"warm_steps={warm_steps}: need at least one step to time from")
    result, aux, prev, length = state_after_steps(verifier, device_tree, prompt_ids, warm_steps)
    nodes = device_tree.params.budget + 1
    if length + nodes > verifier.runner.capacity:
        raise ValueError(f"context {length} + {nodes} tree nodes do not fit the teacher cache "
                         f"({verifier.runner.capacity}): use a shorter prompt or fewer warm steps")
    verify_width = verifier.runner.attention_width(length + nodes)
    draft, verify = device_tree.graph(verify_width), verifier.verify_step(verify_width, nodes)  # as the product
    fused = FusedTreeStep(draft, verify)
    prev_t = Tensor(np.array([prev], np.int32))
    decode = verifier.decode_steps[verify_width]
    bonus = Tensor(np.array([[unpack_result(result.asnumpy())[0].tokens[-1]]], np.int32))
    at = Tensor(np.array([length], np.int32))

    def two_calls():
        tree = draft(result, aux, prev_t)
        return verify(tree[TOKENS], tree[POSITION_IDS], tree[TREE_MASK], tree[PATHS], tree[PATH_LENGTHS],
                      Tensor(np.array([length], np.int32)))[0].asnumpy()

    def one_call():
        return fused(result, aux, prev_t)[0].asnumpy()

    def decode_call():
        return decode(bonus, at)[0].asnumpy()

    want = two_calls()
    t0 = time.perf_counter()
    equal = bool(np.array_equal(one_call(), want))  # the first call compiles the fused graph
    compile_s = time.perf_counter() - t0
    times = {"two_calls": [], "fused": [], "decode": []}
    arms = (("two_calls", two_calls), ("fused", one_call), ("decode", decode_call))
    for r in range(rounds):
        for name, arm in (arms if r % 2 == 0 else arms[::-1]):
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = arm()
                times[name].append(time.perf_counter() - t0)
                equal = equal and (name == "decode" or bool(np.array_equal(out, want)))
    two, one, dec = (float(np.median(times[k])) * 1e3 for k in ("two_calls", "fused", "decode"))
    verifier.runner.reset()
    return {"context": int(length), "draft_window": int(draft.window), "verify_window": int(verify_width),
            "two_calls_ms": two, "fused_ms": one, "decode_ms": dec, "fused_over_two_calls": one / two,
            "fused_over_decode": one / dec,
            "fused_compile_s": compile_s, "results_equal": equal}
