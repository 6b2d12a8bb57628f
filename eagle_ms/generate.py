"""The one generation loop: prefill, then draft -> tensorize -> verify -> accept -> commit.

Two implementations of the step, one loop (stop rules, fallback gate, emission, traces):
  * the device step (eagle_ms/device_step.py, ``speculative.step: device``): one draft graph
    call and one verify+accept+commit graph call; the host reads only the packed tokens;
  * the host-driven step (eagle_ms/host_step.py, ``speculative.step: host``, the default): host tree build, host masks,
    logits and aux copied to the host; the reference the device step is compared with.

Teacher-only greedy decoding is this same loop with no drafter: the "tree" is the root alone
(budget 0, N = 1), so verify is a one-token decode and the accepted path is just the bonus token.

Step contract (batch 1). Before a step the teacher cache holds the committed prefix [0, L) and ``root``
is the last chosen token, not yet in the cache. A step
  1. asks the drafter for a DraftTree rooted at ``root`` (or uses the empty tree),
  2. tensorises it at committed length L (fixed N = budget + 1),
  3. verifies all N nodes in one teacher forward (slots [L, L+N), prefix untouched),
  4. accepts the longest matching root-to-leaf path plus one bonus token: matching the teacher's argmax
     (temperature 0) or its position-keyed sample at every node (sample-and-match, eagle_ms/verify.py),
  5. commits the accepted nodes' K/V to [L, L+A+1) and emits the A drafts + the bonus token.
The token at absolute position p is the teacher's choice for p (argmax, or the sample keyed by
(seed, p): eagle_ms/sampling.py) whatever the tree, so teacher-only and speculative output agree token
for token at every temperature. Stops: EOS (emitted, then stop), ``max_new_tokens``, or KV capacity.
Near capacity the loop falls back to N = 1 steps so speculative output stops exactly where teacher-only
output would.

Low-acceptance fallback (``fallback_accept`` > 0, eagle_ms/fallback.py): while the moving average of
accept_L is below it, steps are teacher-only (N = 1) and the drafter is not called; the committed tokens
and their aux features are buffered and handed to ``drafter.observe`` in one call just before the next
speculative step (so the drafter's context stays complete). With no fallback every step observes at once.
With ``fallback_accept: auto`` the bar is the break-even accept_L measured from the step times of this
and earlier generations (``DecodeSettings.step_costs``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from eagle_ms.config import GREEDY, SamplingParams
from eagle_ms.depth_policy import DepthPolicy
from eagle_ms.device_step import DeviceSteps
from eagle_ms.drafting import TreeParams
from eagle_ms.fallback import SpeculationGate, StepCosts
from eagle_ms.host_step import HostSteps
from eagle_ms.metrics import tau
from eagle_ms.teacher import TeacherRunner
from eagle_ms.tree import DraftTree

STAGES = ("prefill", "draft_prefill", "draft", "tensorize", "mask", "verify", "accept", "commit", "observe")


class Drafter(Protocol):
    """What the loop needs from a draft model (EAGLE-3, the test drafter, ...)."""

    def begin(self, prompt_ids: np.ndarray, prompt_aux: np.ndarray, root: int) -> None:
        """Prompt tokens [P], the teacher aux features of the prompt [P, 3H], the first chosen token."""

    def propose(self, root: int, params: TreeParams | None = None) -> DraftTree:
        """A tree rooted at ``root`` with at most ``budget`` nodes and depth <= ``max_depth`` (of ``params``
        when given: ``DecodeSettings.shallow``, eagle_ms/depth_policy.py; else the drafter's own)."""

    def observe(self, committed: np.ndarray, aux: np.ndarray, next_root: int) -> None:
        """The tokens committed since the last call [n] (the root first; n = A+1 after one step, more after
        teacher-only fallback steps), their teacher aux features [n, 3H], the next root (the bonus)."""


@dataclass(frozen=True)
class DecodeSettings:
    """Budget (M), depth bound (Dmax), token choice, limits and checks of one generation."""

    budget: int = 0
    max_depth: int = 1
    max_new_tokens: int = 64
    eos_token_id: int | None = None
    reference_checks: bool = False  # invariants before every verify + commit equivalence after every commit
    run_dir: str | None = None  # where failure dumps go
    on_step: Callable[["StepRecord"], None] | None = None  # called after every verify step (traces)
    fallback_accept: float | str = 0.0  # teacher-only steps while the accept_L average is below this (0 = never;
    #                                      "auto": the break-even of ``step_costs``, eagle_ms/fallback.py)
    fallback_steps: int = 16  # teacher-only steps per fallback period
    sampling: SamplingParams = GREEDY  # temperature 0 = greedy; else position-keyed sampling
    step_costs: StepCosts | None = None  # measured step seconds, shared by a Session's runs (fallback "auto")
    shallow: TreeParams | None = None  # the tree after a low-acceptance step (speculative.shallow_depth; None: off)


@dataclass
class StepRecord:
    """One verify step, for traces."""

    tree_nodes: int
    tree_depth: int | None  # None: a device tree not read back (performance mode)
    accepted_len: int
    accepted_path: list[int]
    reorder_copy: bool
    stage_s: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class GenerationResult:
    prompt_tokens: int
    tokens: list[int]
    stop_reason: str  # eos | max_new_tokens | capacity
    steps: list[StepRecord]
    prefill_s: float
    total_s: float
    draft_prefill_s: float = 0.0  # drafter.begin (draft model over the prompt)
    fallback_bar: float = 0.0  # the gate's accept_L bar at the end (measured with fallback_accept "auto")

    @property
    def verify_steps(self) -> int:
        return len(self.steps)

    @property
    def accepted_lengths(self) -> list[int]:
        return [s.accepted_len for s in self.steps]

    @property
    def tau(self) -> float | None:
        """Mean tokens per verify step (accepted drafts + 1 bonus); None without steps (eagle_ms/metrics.py)."""
        return tau(self.accepted_lengths)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.total_s if self.total_s > 0 else 0.0


def _emit(out: list[int], new: np.ndarray, settings: DecodeSettings) -> str | None:
    """Append tokens honouring EOS and max_new_tokens; return the stop reason if one was hit."""
    for tok in new.tolist():
        out.append(int(tok))
        if settings.eos_token_id is not None and tok == settings.eos_token_id:
            return "eos"
        if len(out) >= settings.max_new_tokens:
            return "max_new_tokens"
    return None


def generate(runner: TeacherRunner, prompt_ids, settings: DecodeSettings, drafter: Drafter | None = None,
             verifier=None) -> GenerationResult:
    """Greedy or sampled generation (``settings.sampling``); speculative when ``drafter`` is given,
    teacher-only otherwise. The first token is chosen from the last prompt row, at position P.

    ``verifier`` (a ``DeviceVerifier`` over ``runner``): the device step (eagle_ms/device_step.py; the
    drafter may then be a ``DeviceTreeDrafter``); None: the host-driven step (eagle_ms/host_step.py).
    """
    t0 = time.perf_counter()
    prompt_ids = np.asarray(prompt_ids, dtype=np.int32)
    engine = HostSteps(runner, drafter, settings) if verifier is None else DeviceSteps(verifier, drafter, settings)
    root, draft_prefill_s = engine.start(prompt_ids)
    prefill_s = time.perf_counter() - t0 - draft_prefill_s
    tokens: list[int] = []
    steps: list[StepRecord] = []
    gate = SpeculationGate(settings.fallback_accept, settings.fallback_steps, settings.step_costs)
    depth = DepthPolicy(settings.shallow)
    stop = _emit(tokens, np.array([root]), settings)
    while stop is None:
        if runner.length + 1 > runner.capacity:
            stop = "capacity"
            break
        out = engine.step(root, drafter is not None and gate.speculate(), depth.tree())
        depth.record(out.accepted_len if out.drafted else None)
        root = int(out.tokens[-1])
        stop = _emit(tokens, np.asarray(out.tokens), settings)  # A drafts + bonus
        if drafter is not None and stop is None:
            gate.record(out.accepted_len if out.drafted else None)
            if gate.speculate():
                engine.observe(root)
        out.clock.lap("observe")
        if settings.step_costs is not None:
            settings.step_costs.record(out.drafted, sum(out.clock.stages.values()))
        record = StepRecord(out.tree_nodes, out.tree_depth, out.accepted_len, out.node_ids.tolist(), out.copied,
                            out.clock.stages)
        steps.append(record)
        if settings.on_step is not None:
            settings.on_step(record)
    return GenerationResult(int(prompt_ids.size), tokens, stop, steps, prefill_s, time.perf_counter() - t0,
                            draft_prefill_s, gate.min_accept)
