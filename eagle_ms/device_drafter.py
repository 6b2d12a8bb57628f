"""Host driver of the device-resident draft tree: one ``DraftTreeStep`` per attention window, warm-up,
and the step's tree as device tensors (for the verify graph) or host ``TreeTensors`` (reference mode, tests).

Use (batch 1; the lead's loop integration follows the contract of eagle_ms/models/draft_tree_step.py):

    device = DeviceTreeDrafter(eagle3_drafter)        # shares its draft, cache and settings
    device.warm_up()                                  # one graph per attention window
    eagle3_drafter.begin(prompt, aux, root)           # prompt extend; keeps the root pair on the device
    tree = device.step(no_step_result(D), aux0, L, accepted=-1)   # first tree, at L' = L
    ... verify -> packed result r (A = r[0, 0]), accepted aux rows ...
    tree = device.step(r, accepted_aux, L, accepted=A)            # extend + next tree, at L' = L + A + 1

``step`` needs A on the host only to pick the window (W >= L') and to check the capacity; the tensors it
passes may stay on the device. After a step the host drafter's committed length follows the device
(``Eagle3Drafter.follow_device``), so teacher-only fallback steps can ``observe`` through the host path.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mindspore import Tensor

from eagle_ms.drafting import TreeParams
from eagle_ms.eagle3_drafter import Eagle3Drafter
from eagle_ms.models.draft_tree_step import ACCEPTED_COLUMN, OUTPUT_NAMES, DraftTreeStep, result_width
from eagle_ms.tree import TreeTensors

__all__ = ["DeviceTree", "DeviceTreeDrafter", "HostTree", "as_tensor", "no_step_inputs", "no_step_result"]


def no_step_result(max_depth: int) -> np.ndarray:
    """The packed result [1, 2D+3] int32 meaning "no step yet" (A = -1): nothing to extend."""
    result = np.zeros((1, result_width(max_depth)), np.int32)
    result[0, ACCEPTED_COLUMN] = -1
    return result


def no_step_inputs(max_depth: int, aux_width: int) -> tuple[np.ndarray, np.ndarray]:
    """(``no_step_result``, zero accepted aux rows [1, D+1, aux_width] f32): the draft inputs when no step
    is pending (A = -1; the aux rows are not read)."""
    return no_step_result(max_depth), np.zeros((1, max_depth + 1, aux_width), np.float32)


@dataclass(frozen=True)
class HostTree:
    """A drafted tree on the host: its tree tensors and the nodes' cumulative draft log-probs [N]
    (root and padding 0)."""

    tensors: TreeTensors
    scores: np.ndarray


@dataclass(frozen=True)
class DeviceTree:
    """One ``DraftTreeStep`` call's outputs (Tensors, batch first; shapes in eagle_ms/models/draft_tree_step.py)
    for the teacher at committed length ``committed_len`` (L')."""

    tokens: Tensor
    parent: Tensor
    depth: Tensor
    valid: Tensor
    ancestors: Tensor
    position_ids: Tensor
    cache_slots: Tensor
    tree_mask: Tensor
    paths: Tensor
    path_lengths: Tensor
    num_paths: Tensor
    scores: Tensor
    committed_len: int
    budget: int
    max_depth: int

    def to_host(self) -> HostTree:
        """Batch row 0 as NumPy ``TreeTensors`` (the host path's types) plus scores (reads the device)."""
        arrays = {name: getattr(self, name).asnumpy()[0] for name in OUTPUT_NAMES}
        scores = arrays.pop("scores").astype(np.float64)
        arrays["num_paths"] = int(arrays["num_paths"])
        return HostTree(TreeTensors(**arrays, committed_len=self.committed_len, budget=self.budget,
                                    max_depth=self.max_depth), scores)


class DeviceTreeDrafter:
    """``DraftTreeStep`` graphs for an ``Eagle3Drafter`` (same draft, cache, TreeParams, context window and
    attention windows), one per window, built on first use or by ``warm_up``."""

    def __init__(self, drafter: Eagle3Drafter):
        self.drafter = drafter
        self.params = drafter.params
        self.capacity = drafter.committed_capacity
        self.aux_width = 3 * drafter.draft.config.target_hidden_size
        self.steps: dict[int, DraftTreeStep] = {}

    def window(self, length: int) -> int:
        """The smallest attention window >= L' (pairs the step reads). Example: windows (16, 48), 17 -> 48."""
        for w in self.drafter.attention_windows:
            if w >= length:
                return w
        raise ValueError(f"draft cache full: {length} pairs needed, capacity {self.capacity}")

    def graph(self, window: int, params: TreeParams | None = None) -> DraftTreeStep:
        """The window's draft graph for the tree ``params`` (None: the drafter's own; a shallow tree of
        ``TreeParams.shallow`` gets a graph of its own with the same D-shaped inputs and outputs)."""
        params = self.params if params is None else params
        if (window, params) not in self.steps:
            d = self.drafter
            self.steps[window, params] = DraftTreeStep(d.draft, params, d.context_window, self.capacity, window,
                                                       tensor_depth=self.params.max_depth)
        return self.steps[window, params]

    def step(self, result, accepted_aux, committed_len: int, accepted: int,
             params: TreeParams | None = None) -> DeviceTree:
        """Extend by the previous verify's result and draft the next tree (one graph call).

        result [1, 2D+3] int32 and accepted_aux [1, D+1, 3Ht] (Tensors or arrays; padding rows any finite
        values), committed_len L (pairs committed before this call), accepted A (-1: no step yet),
        ``params``: the tree to draft (None: the drafter's own). Raises ValueError naming the value when A
        is out of range or L + A + 1 pairs do not fit the cache.
        """
        length = self.next_length(committed_len, accepted)
        outputs = self.graph(self.window(length), params)(
            as_tensor(result, np.int32), as_tensor(accepted_aux, np.float32),
            Tensor(np.array([committed_len], np.int32)))
        self.drafter.follow_device(length)
        return self.tree(outputs, length, params)

    def next_length(self, committed_len: int, accepted: int) -> int:
        """L' = L + A + 1, the committed length the next tree is drafted at. Raises ValueError naming the
        value when A is out of [-1, max_depth] or L' pairs do not fit the cache."""
        d = self.params.max_depth
        if not -1 <= accepted <= d:
            raise ValueError(f"accepted={accepted}: must be in [-1, max_depth {d}]")
        length = committed_len + accepted + 1
        if committed_len < (1 if accepted < 0 else 0) or length > self.capacity:
            raise ValueError(f"committed_len={committed_len} + accepted {accepted} + 1 = {length} pairs must be in "
                             f"[1, capacity {self.capacity}]")
        return length

    def tree(self, outputs, length: int, params: TreeParams | None = None) -> DeviceTree:
        """The twelve DraftTreeStep outputs (OUTPUT_NAMES order) of the tree drafted at L' = ``length``
        with ``params`` (None: the drafter's own; the tensors are D = the drafter's max_depth deep)."""
        budget = (self.params if params is None else params).budget
        return DeviceTree(*outputs, committed_len=length, budget=budget, max_depth=self.params.max_depth)

    def warm_up(self, windows=None, params: TreeParams | None = None) -> None:
        """Compile the graph of every attention window (or of ``windows``) for the tree ``params`` (None:
        the drafter's own). Each call has A = -1, so it writes only scratch slots and stores the root pair
        it read; the drafter is left empty (``begin`` comes next)."""
        result, aux = (Tensor(x) for x in no_step_inputs(self.params.max_depth, self.aux_width))
        for w in self.drafter.attention_windows if windows is None else windows:
            self.graph(w, params)(result, aux, Tensor(np.array([w], np.int32)))
        self.drafter.length = 0


def as_tensor(value, dtype) -> Tensor:
    """``value`` as a Tensor of ``dtype``; a Tensor (for example a graph output) is passed as it is."""
    return value if isinstance(value, Tensor) else Tensor(np.asarray(value, dtype))

