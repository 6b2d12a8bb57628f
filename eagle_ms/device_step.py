"""The device-resident speculative step: one draft graph call, one verify graph call, one small int read
(or, with ``speculative.step: fused``, one graph call doing both: eagle_ms/device_fused.py).

Per drafted step (eagle_ms/models/draft_tree_step.py, eagle_ms/models/verify_step.py):

    tree   = DraftTreeStep(prev result, prev accepted_aux, L_prev)   extend + whole EAGLE-2 tree (device)
    result = VerifyStep(tree tensors, L)                              verify + accept + commit (device)
    host reads result [1, 2D+3] int32: A, the A drafts + bonus, the node ids

The previous step's packed result and accepted aux rows go from the verify graph to the next draft graph
as device tensors; the host never reads them in performance mode. A teacher-only step (no drafter, a
fallback step, or no room for a tree near the end of the cache) is the decode graph
(``DeviceVerifier.decode``, ``DecodeStep``: two inputs): the host still sees only the packed result.

Pairs not yet in the draft cache: normally just the last step's (the next draft call extends them in
its graph). After teacher-only fallback steps there are several; they are handed to the host drafter's
``observe`` in one call (the only time aux features [n, 3H] come to the host) and the next draft call
starts from the root pair that extend left on the device (A = -1).

Fused (``FusedTreeSteps`` as the drafter): a drafted step is one graph call, timed as the stage
``draft_verify`` (the call, the result read and the commit), so such runs do not time the verify forward
apart (docs/metrics.md). Reference mode reads the tree back after that call and checks it as below before
the result is read.

Protocol drafters (the test drafter) draft on the host: their trees are tensorised on the host and
verified by the same device graph.

Reference mode additionally reads every device tree back: ``tree_checks.check_invariants``, equality with
the host path's tree from the same draft state (eagle_ms/draft_tree_check.py), the device acceptance
against ``verify.greedy_accept`` on the read-back argmax, and ``host_step.check_commit`` (commit equivalence,
and every emitted token against the host argmax or sampler on a sequential re-decode).
"""
from __future__ import annotations

import time

import numpy as np

from eagle_ms.device_drafter import DeviceTreeDrafter, no_step_inputs
from eagle_ms.device_fused import FusedTreeSteps
from eagle_ms.device_verify import DeviceStep, DeviceVerifier, TreeInputs
from eagle_ms.draft_tree_check import check_device_tree
from eagle_ms.drafting import TreeParams
from eagle_ms.host_step import Clock, StepOutcome, check_commit, first_token
from eagle_ms.tree import TreeTensors, tensorize
from eagle_ms.tree_checks import check_invariants


class DeviceSteps:
    """The device step (module doc). ``drafter``: a DeviceTreeDrafter (EAGLE-3 on the device), a
    FusedTreeSteps over ``verifier`` (the same, draft and verify in one call), a Protocol drafter (host
    trees), or None (teacher-only)."""

    def __init__(self, verifier: DeviceVerifier, drafter, settings):
        if verifier.sampling != settings.sampling:
            raise ValueError(f"the device verifier samples with {verifier.sampling}, the generation asks for "
                             f"{settings.sampling}: build the verifier with the generation's sampling settings")
        self.verifier, self.runner, self.settings = verifier, verifier.runner, settings
        self.fused = drafter if isinstance(drafter, FusedTreeSteps) else None
        if self.fused is not None:
            if self.fused.verifier is not verifier:
                raise ValueError("the fused graphs were built over another verifier than this step's")
            if settings.reference_checks and not verifier.reference:
                raise ValueError("reference checks need the fused graphs' tree outputs: build the "
                                 "DeviceVerifier with reference=True")
            drafter = self.fused.device_tree
        self.device_tree = drafter if isinstance(drafter, DeviceTreeDrafter) else None
        self.host_drafter = None if self.device_tree is not None else drafter
        self._pending: list[tuple[int, int, DeviceStep]] = []  # (L before, root, step) not yet drafted from

    @property
    def has_drafter(self) -> bool:
        return self.device_tree is not None or self.host_drafter is not None

    def start(self, prompt_ids: np.ndarray) -> tuple[int, float]:
        """Prefill (host logits of the prompt's chunks, once) and the drafter's begin: (first token, s)."""
        root, aux = first_token(self.runner, prompt_ids, self.settings)
        t0 = time.perf_counter()
        self._pending.clear()
        if self.device_tree is not None:
            self.device_tree.drafter.begin(prompt_ids, aux, root)
        elif self.host_drafter is not None:
            self.host_drafter.begin(prompt_ids, aux, root)
        return root, time.perf_counter() - t0

    def step(self, root: int, speculate: bool, params: TreeParams | None = None) -> StepOutcome:
        """One step; ``params``: the tree to draft (None: the drafter's own; eagle_ms/depth_policy.py)."""
        runner, settings, clock = self.runner, self.settings, Clock()
        start = runner.length
        budget = settings.budget if params is None else params.budget
        room = start + budget + 1 <= runner.capacity
        drafted = self.has_drafter and speculate and room
        host_tree = None
        if drafted and self.device_tree is not None:
            step, host_tree = self._device_tree_step(clock, params)
        elif drafted:
            tree = self.host_drafter.propose(root) if params is None else self.host_drafter.propose(root, params)
            clock.lap("draft")
            host_tree = tensorize(tree, start, budget, settings.max_depth)
            if settings.reference_checks:
                check_invariants(host_tree, settings.run_dir)
            clock.lap("tensorize")
            step = self.verifier.verify(host_tree)
            clock.lap("verify")
        else:
            clock.lap("draft")
            step = self.verifier.decode(root)
            clock.lap("verify")
        if settings.reference_checks:
            check_commit(runner, start, np.append(root, step.tokens[:-1]).astype(np.int32), step.tokens,
                         settings.sampling)
        clock.lap("commit")
        if self.has_drafter:
            self._pending.append((start, root, step))
        nodes, depth = self._tree_size(drafted, host_tree, params)
        return StepOutcome(step.tokens, step.accepted_len, step.node_ids, drafted, nodes, depth, step.copied,
                           clock)

    def observe(self, next_root: int) -> None:
        """Before a drafted step: pairs of more than the last step go through the host drafter."""
        if self.host_drafter is not None:
            self._observe_on_host(self.host_drafter, next_root)
        elif self.device_tree is not None and len(self._pending) > 1:
            self._observe_on_host(self.device_tree.drafter, next_root)

    # ------------------------------------------------------------------ internals

    def _device_tree_step(self, clock: Clock, params: TreeParams | None) -> tuple[DeviceStep, TreeTensors | None]:
        """A drafted step of the device tree ``params`` (None: the drafter's own): two graph calls (stages
        ``draft``, ``verify``) or one fused call (stage ``draft_verify``: the call, then the result read and
        the commit). Reference mode reads the tree back between them and checks it (stage ``tensorize``);
        returns (step, host tree or None)."""
        settings, fused = self.settings, self.fused
        if fused is not None:
            outputs, tree = fused.call(*self.draft_inputs(), params)
        else:
            tree = self.device_tree.step(*self.draft_inputs(), params)
        clock.lap("draft" if fused is None else "draft_verify")
        host_tree = None
        if settings.reference_checks:
            host_tree = check_device_tree(self.device_tree.drafter, tree, settings.run_dir, params).tensors
            check_invariants(host_tree, settings.run_dir)
        clock.lap("tensorize")
        if fused is not None:
            step = self.verifier.read_step(outputs, host_tree)
            clock.lap("draft_verify")
        else:
            step = self.verifier.verify(TreeInputs(tree.tokens, tree.position_ids, tree.tree_mask, tree.paths,
                                                   tree.path_lengths, tree.committed_len, host_tree))
            clock.lap("verify")
        return step, host_tree

    def draft_inputs(self) -> tuple:
        """(result, accepted_aux, L, A) of the next draft graph call, taken from the pending steps: extend by
        the one pending step, or by none (A = -1: right after begin or a host observe, the root pair is
        already on the device). Also used by eagle_ms/bench/fused_step_timing.py to reach a state to time."""
        if not self._pending:
            return *no_step_inputs(self.settings.max_depth, self.verifier.aux_width), self.runner.length, -1
        (length, _, step), = self._pending
        self._pending.clear()
        return step.result, step.accepted_aux, length, step.accepted_len

    def _observe_on_host(self, drafter, next_root: int) -> None:
        """All pending steps' committed tokens and aux rows in one ``observe`` call (host copies)."""
        if not self._pending:
            return
        committed = [np.append(root, s.tokens[:-1]) for _, root, s in self._pending]
        aux = [self.verifier.aux_rows(s) for _, _, s in self._pending]
        drafter.observe(np.concatenate(committed), np.concatenate(aux), next_root)
        self._pending.clear()

    def _tree_size(self, drafted: bool, host_tree, params: TreeParams | None) -> tuple[int, int | None]:
        if not drafted:
            return 0, 0
        if host_tree is not None:
            return int(host_tree.valid.sum()) - 1, int(host_tree.depth.max())
        p = self.device_tree.params if params is None else params
        return min(p.budget, p.max_candidates), None  # not read back in performance mode (a depth cut may draft fewer)

