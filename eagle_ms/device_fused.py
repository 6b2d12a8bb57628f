"""Host driver of the fused device step (eagle_ms/models/fused_step.py): draft + verify in one graph call.

``FusedTreeSteps`` owns one ``FusedTreeStep`` per attention window of the teacher runner, built from the
``DeviceTreeDrafter``'s draft graph and the ``DeviceVerifier``'s verify graph of that window. A step at
committed length L' uses the window ``TeacherRunner.attention_width(L' + N)`` for both halves, so there is
one fused graph per window (not one per (draft window, verify window) pair): the draft half reads more
masked slots on the few steps where L' alone would fit a smaller window, with the same tree.

    fused = FusedTreeSteps(device_tree, verifier)
    fused.warm_up()                                   # one graph per window; caches left empty
    outputs, tree = fused.call(prev_result, prev_aux, L_prev, A_prev)   # one graph call
    step = verifier.read_step(outputs, host_tree)     # the one small read + the host commit

``tree`` is None in performance mode; in reference mode it is the drafted tree as device tensors, read
back after the call (eagle_ms/device_step.py checks it against the host path).
"""
from __future__ import annotations

import numpy as np

from mindspore import Tensor

from eagle_ms.device_drafter import DeviceTree, DeviceTreeDrafter, as_tensor, no_step_inputs
from eagle_ms.device_verify import DeviceVerifier
from eagle_ms.drafting import TreeParams
from eagle_ms.models.draft_tree_step import OUTPUT_NAMES
from eagle_ms.models.fused_step import FusedTreeStep


class FusedTreeSteps:
    """One fused draft+verify graph per attention window (module doc), over a DeviceTreeDrafter and a
    DeviceVerifier that share the teacher runner's committed length."""

    def __init__(self, device_tree: DeviceTreeDrafter, verifier: DeviceVerifier):
        if device_tree.params.max_depth != verifier.max_depth:
            raise ValueError(f"draft max_depth {device_tree.params.max_depth} != verifier max_depth "
                             f"{verifier.max_depth}")
        self.device_tree, self.verifier, self.runner = device_tree, verifier, verifier.runner
        self.graphs: dict[tuple[int, TreeParams], FusedTreeStep] = {}

    def graph(self, window: int, params: TreeParams | None = None) -> FusedTreeStep:
        """The window's fused graph for the tree ``params`` (None: the drafter's own), built on first use
        and compiled on its first call."""
        params = self.device_tree.params if params is None else params
        if (window, params) not in self.graphs:
            verify = self.verifier.verify_step(window, params.budget + 1)
            self.graphs[window, params] = FusedTreeStep(self.device_tree.graph(window, params), verify,
                                                        with_tree=self.verifier.reference)
        return self.graphs[window, params]

    def call(self, result, accepted_aux, committed_len: int, accepted: int,
             params: TreeParams | None = None) -> tuple[tuple, DeviceTree | None]:
        """Extend the draft by the previous step (L = ``committed_len``, A = ``accepted``; A = -1: no step
        since ``begin``/``observe``), draft the tree ``params`` (None: the drafter's own) at L' = L + A + 1
        and verify it: one graph call.

        Returns (the verify outputs for ``DeviceVerifier.read_step``, the tree or None). Nothing is read
        back here. Raises ValueError, before any call, when L' is not the teacher's committed length or
        the tree does not fit the cache."""
        length = self.device_tree.next_length(committed_len, accepted)
        if length != self.runner.length:
            raise ValueError(f"the draft would be at {length} committed pairs (L {committed_len} + A {accepted} "
                             f"+ 1) but the teacher cache holds {self.runner.length}")
        params = self.device_tree.params if params is None else params
        window = self.runner.attention_width(length + params.budget + 1)  # ValueError when the tree does not fit
        outputs = self.graph(window, params)(as_tensor(result, np.int32), as_tensor(accepted_aux, np.float32),
                                             Tensor(np.array([committed_len], np.int32)))
        self.device_tree.drafter.follow_device(length)
        if not self.verifier.reference:
            return outputs, None
        split = len(outputs) - len(OUTPUT_NAMES)  # the verify outputs, then the tree's
        return outputs[:split], self.device_tree.tree(outputs[split:], length, params)

    def warm_up(self, params: TreeParams | None = None) -> None:
        """Compile every window's graph that a tree of ``params`` (None: the drafter's own) fits
        (W >= N + 1). Each call has A = -1 and L' = W - N: the draft half writes scratch slots only and
        keeps the root pair it read, the verify half writes teacher slots past the committed region.
        Leaves both caches empty (the drafter's ``begin`` comes next)."""
        params = self.device_tree.params if params is None else params
        nodes = params.budget + 1
        result, aux = (Tensor(x) for x in no_step_inputs(self.verifier.max_depth, self.verifier.aux_width))
        for window in self.runner.attention_windows:
            if window >= nodes + 1:
                self.graph(window, params)(result, aux, Tensor(np.array([window - nodes], np.int32)))
        self.runner.reset()
        self.device_tree.drafter.length = 0

