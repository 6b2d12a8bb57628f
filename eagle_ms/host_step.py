"""The host-driven speculative step: draft on the host (Drafter protocol), tensorise, verify with the
teacher's logits and aux copied to the host, accept, commit, observe.

This is the step of the original design and the reference the device step is compared with; the loop
uses it for Protocol drafters without a device verifier (eagle_ms/generate.py ``generate(...,
verifier=None)``, ``speculative.step: host``). Per step: ``drafter.propose`` (host ``build_tree`` with one
draft ``expand`` call per depth), ``tree.tensorize`` + the verify mask on the host, one teacher call whose
[N, V] logits and [N, 3H] aux come back to the host, ``verify.greedy_accept`` (or sample-and-match),
``BranchCache.commit_by_path`` (a CacheMover call when the path is out of slot order), then
``drafter.observe`` with the committed tokens and their aux features.

Also here, shared with the device step (eagle_ms/device_step.py): ``StepOutcome`` (what the loop needs of
a step), ``Clock`` (stage laps) and the reference-mode check against a sequential re-decode (commit
equivalence, and each emitted token is the host argmax / sampler's choice).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from eagle_ms.drafting import TreeParams
from eagle_ms.teacher import TeacherRunner
from eagle_ms.trace import write_failure_dump
from eagle_ms.tree import DraftTree, TreeInvariantError, tensorize, verify_attention_mask
from eagle_ms.tree_checks import check_invariants
from eagle_ms.sampling import sample_rows
from eagle_ms.verify import greedy_accept, sample_accept, tree_samples


class CommitMismatch(AssertionError):
    """Reference mode: the committed cache differs from sequential decoding of the accepted tokens."""


class Clock:
    """Stage laps of one step: ``lap(name)`` adds the time since the previous lap to ``stages[name]``."""

    def __init__(self):
        self.stages: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + now - self._t
        self._t = now


@dataclass(frozen=True)
class StepOutcome:
    """One verify step as the loop sees it (batch 1): tokens, not tensors."""

    tokens: np.ndarray      # [A+1] int: the A accepted drafts, then the bonus token
    accepted_len: int       # A
    node_ids: np.ndarray    # [A+1] accepted node ids, root first
    drafted: bool           # a draft tree was verified (False: teacher-only / fallback / no room)
    tree_nodes: int         # draft nodes in the tree (0 for teacher-only steps)
    tree_depth: int | None  # the tree's depth; None when the host did not read the tree (device, performance)
    copied: bool            # the commit moved K/V rows (accepted path out of slot order)
    clock: Clock


def redecoded_rows(runner: TeacherRunner, start: int, tokens: np.ndarray):
    """(committed, redone, logits): the K/V rows of slots [start, start+len) as committed, as a sequential
    re-decode of ``tokens`` from ``start`` writes them, and that re-decode's logits [len, V] (row i: after
    tokens[i]); the cache and length are restored afterwards."""
    committed = runner.cache_rows(start, start + tokens.size)
    snapshot, length = runner.snapshot(), runner.length
    runner.rewind(start)
    logits = runner.decode_chain(tokens).logits
    redone = runner.cache_rows(start, start + tokens.size)
    runner.restore(snapshot, length)
    return committed, redone, logits


def check_commit(runner: TeacherRunner, start: int, tokens: np.ndarray, emitted: np.ndarray, sampling) -> None:
    """Reference check of one step's commit and choices against a sequential re-decode of ``tokens``.

    The committed K/V of slots [start, start+len) must equal the re-decode's, and the teacher's choice
    after each committed token on that re-decode (argmax, or at T > 0 the host sampler ``sample_rows``
    keyed by the next position, start + i + 1) must be ``emitted[i]`` (the A accepted drafts, then the
    bonus). For the device step this checks the in-graph acceptance and sampler against the host
    reference. A float near-tie between the tree forward and the sequential one can flip a choice
    too; for greedy the message gives the top-2 margin."""
    committed, redone, logits = redecoded_rows(runner, start, tokens)
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(committed, redone))
    scale = max(float(np.max(np.abs(b))) for b in redone) or 1.0
    if worst > 1e-4 * max(scale, 1.0):
        raise CommitMismatch(f"commit equivalence failed at slots [{start}, {start + tokens.size}): "
                             f"max |diff| {worst:.3e} (tokens {tokens.tolist()})")
    positions = start + 1 + np.arange(tokens.size)
    chosen = logits.argmax(-1) if sampling.greedy else sample_rows(logits, positions, sampling)
    bad = np.flatnonzero(chosen != emitted)
    if bad.size:
        i = int(bad[0])
        top = np.sort(logits[i])[-2:]
        why = f"top-2 logit margin {float(top[1] - top[0]):.3e}" if sampling.greedy else f"seed {sampling.seed}"
        raise CommitMismatch(f"the step emitted token {int(emitted[i])} at position {int(positions[i])}, but the "
                             f"host {'argmax' if sampling.greedy else 'sampler'} on a sequential re-decode "
                             f"chooses {int(chosen[i])} ({why})")


def first_token(runner: TeacherRunner, prompt_ids: np.ndarray, settings):
    """Prefill the prompt; (the first chosen token, at position P; the prompt's aux features [P, 3H])."""
    pre = runner.prefill(prompt_ids)
    if settings.sampling.greedy:
        return int(pre.argmax[-1]), pre.aux
    return int(sample_rows(pre.logits[-1:], [prompt_ids.size], settings.sampling)[0]), pre.aux


class HostSteps:
    """The host-driven step (module doc) over ``runner`` with an optional Protocol ``drafter``.

    Low-acceptance fallback: the committed tokens and aux of steps taken while the gate says "do not
    speculate" are buffered and handed to ``drafter.observe`` in one call before the next drafted step.
    """

    def __init__(self, runner: TeacherRunner, drafter, settings):
        self.runner, self.drafter, self.settings = runner, drafter, settings
        self._unobserved: list[tuple[np.ndarray, np.ndarray]] = []  # (committed [n], aux [n, 3H])

    def start(self, prompt_ids: np.ndarray) -> tuple[int, float]:
        """Prefill and the drafter's begin: (first token, seconds spent in drafter.begin)."""
        root, aux = first_token(self.runner, prompt_ids, self.settings)
        t0 = time.perf_counter()
        self._unobserved.clear()
        if self.drafter is not None:
            self.drafter.begin(prompt_ids, aux, root)
        return root, time.perf_counter() - t0

    def step(self, root: int, speculate: bool, params: TreeParams | None = None) -> StepOutcome:
        """One step; no drafter, ``speculate`` False or no room -> the root alone (N = 1). ``params``: the
        tree to draft (None: the drafter's own; eagle_ms/depth_policy.py)."""
        runner, settings, clock = self.runner, self.settings, Clock()
        budget, start = settings.budget if params is None else params.budget, runner.length
        if self.drafter is None or not speculate or start + budget + 1 > runner.capacity:
            tree, budget = DraftTree(root, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)), 0
        else:
            tree = self.drafter.propose(root) if params is None else self.drafter.propose(root, params)
        clock.lap("draft")
        tensors = self._tensorize(tree, budget)
        clock.lap("tensorize")
        allowed = verify_attention_mask(tensors, runner.attention_width(start + tensors.num_nodes))
        clock.lap("mask")
        out = runner.verify(tensors, allowed)
        clock.lap("verify")
        if settings.sampling.greedy:
            result = greedy_accept(tensors, out.argmax)
        else:
            result = sample_accept(tensors, tree_samples(tensors, out.logits, settings.sampling))
        clock.lap("accept")
        copied = runner.cache.commit_by_path(result.node_ids)
        committed = tensors.tokens[result.node_ids]
        if settings.reference_checks:
            check_commit(runner, start, committed, np.asarray(result.tokens), settings.sampling)
        clock.lap("commit")
        if self.drafter is not None:
            self._unobserved.append((committed, out.aux[result.node_ids]))
        return StepOutcome(np.asarray(result.tokens), result.accepted_len, result.node_ids, budget > 0,
                           int(tensors.valid.sum()) - 1, int(tensors.depth.max()), copied, clock)

    def observe(self, next_root: int) -> None:
        """Hand the buffered committed tokens to the drafter (before a drafted step)."""
        if self.drafter is not None and self._unobserved:
            self.drafter.observe(np.concatenate([c for c, _ in self._unobserved]),
                                 np.concatenate([a for _, a in self._unobserved]), next_root)
            self._unobserved.clear()

    def _tensorize(self, tree: DraftTree, budget: int):
        settings = self.settings
        try:
            tensors = tensorize(tree, self.runner.length, budget, settings.max_depth)
        except TreeInvariantError as exc:  # a malformed DraftTree: dump it too, not only tensor-level failures
            if settings.run_dir and exc.dump_path is None:
                exc.dump_path = write_failure_dump(settings.run_dir, exc.dump)
                exc.args = (f"{exc.args[0]} (failure dump: {exc.dump_path})",)
            raise
        if settings.reference_checks:
            check_invariants(tensors, settings.run_dir)
        return tensors
