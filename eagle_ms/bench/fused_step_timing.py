"""One fused draft+verify graph against the device step's two graph calls (scripts/time_fused_step.py).

Issue #15 asks whether fusing the draft graph (``DraftTreeStep``) and the verify graph (``VerifyStep``)
into one call is faster. ``FusedStep`` is that graph: the previous step's packed result and accepted aux
rows in, the next result and aux rows out, the draft tree's tensors never leaving the graph. The device
step (eagle_ms/device_step.py) makes the same two calls with the tree tensors passed between them as
device tensors, so the fused form can only save one graph launch and the host's hand-over.

``fused_vs_two_calls`` drives a real greedy device-step generation by hand (prefill, drafter begin, draft
call, verify call, ...) for ``warm_steps`` steps, then times, from that state, the two arms on the same
inputs in alternated rounds (medians):

  two_calls  the window's DraftTreeStep, then the window's VerifyStep on its outputs, then the host read of
             the packed result (what a device step does, without its host bookkeeping)
  fused      one FusedStep call, then the same host read

Repeating a call is exact: it rewrites the same cache slots and root pair with the same values. Both
arms must return the same packed result (checked on every call).
"""
from __future__ import annotations

import time

import numpy as np

from mindspore import Tensor, nn

from eagle_ms.device_drafter import DeviceTreeDrafter, no_step_result
from eagle_ms.device_verify import DeviceVerifier, TreeInputs
from eagle_ms.generate import DecodeSettings
from eagle_ms.host_step import first_token
from eagle_ms.models.draft_tree_step import ACCEPTED_COLUMN, OUTPUT_NAMES

# the DraftTreeStep outputs the verify graph takes, by position
TOKENS, POSITION_IDS, TREE_MASK, PATHS, PATH_LENGTHS = (
    OUTPUT_NAMES.index(name) for name in ("tokens", "position_ids", "tree_mask", "paths", "path_lengths"))


class FusedStep(nn.Cell):
    """DraftTreeStep then VerifyStep in one graph (module doc).

    construct(result [B,2D+3] i32, accepted_aux [B,D+1,3Ht], committed_len [B] i32) -> the VerifyStep's
    (result, accepted_aux) for the tree drafted at L' = committed_len + A + 1 (A = result[:, ACCEPTED_COLUMN])."""

    def __init__(self, draft_step, verify_step):
        super().__init__(auto_prefix=False)  # the teacher's and the draft's parameter names stay as they are
        self.draft_step, self.verify_step = draft_step, verify_step

    def construct(self, result, accepted_aux, committed_len):
        tree = self.draft_step(result, accepted_aux, committed_len)
        length = committed_len + result[:, ACCEPTED_COLUMN] + 1
        return self.verify_step(tree[TOKENS], tree[POSITION_IDS], tree[TREE_MASK], tree[PATHS],
                                tree[PATH_LENGTHS], length)


def state_after_steps(verifier: DeviceVerifier, device_tree: DeviceTreeDrafter, prompt_ids, warm_steps: int):
    """Greedy device steps by hand; returns (result, accepted_aux, L_prev, L') of the last verify: the
    next draft call's inputs and the teacher's committed length."""
    runner, d = verifier.runner, verifier.max_depth
    runner.reset()
    root, aux = first_token(runner, np.asarray(prompt_ids, np.int32), DecodeSettings(max_depth=d))
    device_tree.drafter.begin(np.asarray(prompt_ids, np.int32), aux, root)
    result, accepted_aux, accepted = no_step_result(d), np.zeros((1, d + 1, verifier.aux_width), np.float32), -1
    prev = runner.length
    for _ in range(warm_steps):
        tree = device_tree.step(result, accepted_aux, prev, accepted)
        prev = runner.length
        step = verifier.verify(TreeInputs(tree.tokens, tree.position_ids, tree.tree_mask, tree.paths,
                                          tree.path_lengths, tree.committed_len))
        result, accepted_aux, accepted = step.result, step.accepted_aux, step.accepted_len
    return result, accepted_aux, prev, runner.length


def fused_vs_two_calls(verifier: DeviceVerifier, device_tree: DeviceTreeDrafter, prompt_ids, warm_steps: int,
                       repeats: int, rounds: int) -> dict:
    """Times of the two arms (module doc) from the state after ``warm_steps`` steps of ``prompt_ids``.

    Returns {context, draft_window, verify_window, two_calls_ms, fused_ms (medians), fused_over_two_calls,
    fused_compile_s, results_equal}. Raises ValueError if ``warm_steps`` < 1 or the state leaves no room
    for one more tree."""
    if warm_steps < 1:
        raise ValueError(f"warm_steps={warm_steps}: need at least one step to time from")
    result, aux, prev, length = state_after_steps(verifier, device_tree, prompt_ids, warm_steps)
    nodes = device_tree.params.budget + 1
    if length + nodes > verifier.runner.capacity:
        raise ValueError(f"context {length} + {nodes} tree nodes do not fit the teacher cache "
                         f"({verifier.runner.capacity}): use a shorter prompt or fewer warm steps")
    draft = device_tree.graph(device_tree.window(length))
    verify_width = verifier.runner.attention_width(length + nodes)
    verify = verifier.steps[verify_width]
    fused = FusedStep(draft, verify)
    prev_t = Tensor(np.array([prev], np.int32))

    def two_calls():
        tree = draft(result, aux, prev_t)
        return verify(tree[TOKENS], tree[POSITION_IDS], tree[TREE_MASK], tree[PATHS], tree[PATH_LENGTHS],
                      Tensor(np.array([length], np.int32)))[0].asnumpy()

    def one_call():
        return fused(result, aux, prev_t)[0].asnumpy()

    want = two_calls()
    t0 = time.perf_counter()
    equal = bool(np.array_equal(one_call(), want))  # the first call compiles the fused graph
    compile_s = time.perf_counter() - t0
    times = {"two_calls": [], "fused": []}
    arms = (("two_calls", two_calls), ("fused", one_call))
    for r in range(rounds):
        for name, arm in (arms if r % 2 == 0 else arms[::-1]):
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = arm()
                times[name].append(time.perf_counter() - t0)
                equal = equal and bool(np.array_equal(out, want))
    two, one = (float(np.median(times[k])) * 1e3 for k in ("two_calls", "fused"))
    verifier.runner.reset()
    return {"context": int(length), "draft_window": int(draft.window), "verify_window": int(verify_width),
            "two_calls_ms": two, "fused_ms": one, "fused_over_two_calls": one / two,
            "fused_compile_s": compile_s, "results_equal": equal}
