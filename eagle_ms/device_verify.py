"""Host driver of the device verify graph (eagle_ms/models/verify_step.py): one graph call per step and
one small int read (the packed result, eagle_ms/models/step_result.py) instead of [N, V] logits and
[N, 3H] aux features copied to the host.

``DeviceVerifier`` owns one ``VerifyStep`` (trees, N = budget + 1) and one ``DecodeStep`` (teacher-only
and fallback steps: the root alone) per attention window of the ``TeacherRunner``, picks the window
as ``TeacherRunner.attention_width(L + N)`` does, and commits through the runner's ``BranchCache``
(L += A + 1; only an accepted path out of slot order moves K/V rows, the chain-first prefix moves
nothing). With the fused CPU kernels the verify graph moves them itself, in its acceptance kernel
(``VerifyStep.commits``; ``BranchCache.commit_by_path(..., moved=True)``); otherwise the host calls the
model's ``CacheMover`` graph (``BranchCache.commit_by_path``).

Tree inputs come from host ``tree.tensorize`` (``TreeInputs.from_tree``) or straight from the draft
graph's outputs (``TreeInputs(...)`` over its device tensors, which the host never reads). Reference mode
also returns the teacher's argmax [N] and, for host trees, checks the device acceptance against
``verify.greedy_accept``; commit equivalence is checked from the cache rows (``TeacherRunner.cache_rows``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mindspore import Tensor

from eagle_ms.config import GREEDY, SamplingParams
from eagle_ms.models.step_result import unpack_result
from eagle_ms.models.verify_step import DecodeStep, VerifyStep
from eagle_ms.teacher import TeacherRunner
from eagle_ms.token_ids import check_token_ids
from eagle_ms.tree import DraftTree, TreeTensors, tensorize
from eagle_ms.verify import greedy_accept


class DeviceAcceptMismatch(AssertionError):
    """Reference mode: the graph's acceptance differs from ``verify.greedy_accept`` on the same argmax."""


@dataclass(frozen=True, eq=False)
class TreeInputs:
    """The verify graph's tree inputs, MindSpore Tensors with leading B = 1, for committed length L."""

    tokens: Tensor        # [1, N] int32
    position_ids: Tensor  # [1, N] int32, L + depth (the cache slots, L + node id, follow from L)
    tree_mask: Tensor     # [1, N, N] bool
    paths: Tensor         # [1, P, D+1] int32
    path_lengths: Tensor  # [1, P] int32, padding rows 0
    committed_len: int    # L
    host: TreeTensors | None = None  # the host tensors these were made from, if any

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[1])

    @classmethod
    def from_tree(cls, t: TreeTensors) -> "TreeInputs":
        """Host TreeTensors -> Tensors (each array gains the leading batch axis)."""
        def dev(x):
            return Tensor(np.ascontiguousarray(x)[None])
        return cls(dev(t.tokens), dev(t.position_ids), dev(t.tree_mask), dev(t.paths),
                   dev(t.path_lengths), t.committed_len, t)


@dataclass(frozen=True, eq=False)
class DeviceStep:
    """One device verify step as the host sees it: tokens, not tensors (batch 1)."""

    accepted_len: int      # A
    tokens: np.ndarray     # [A+1] int32: the A accepted drafts, then the bonus token
    node_ids: np.ndarray   # [A+1] int32, root first
    copied: bool           # the accepted path was out of slot order (the commit moved K/V rows)
    result: Tensor         # [1, 2D+3] int32 packed result, on device: the next draft call's input
    accepted_aux: Tensor   # [1, D+1, 3H] on device: rows 0..A are the accepted nodes' aux features
    argmax: np.ndarray | None = None  # [N] the teacher's argmax per node: reference mode only

    @property
    def bonus_token(self) -> int:
        return int(self.tokens[-1])


class DeviceVerifier:
    """Verify + accept (+ commit, with the CPU kernels) in one graph call per step, over a TeacherRunner's
    teacher and cache; without the kernels an out-of-order path costs a CacheMover call."""

    def __init__(self, runner: TeacherRunner, max_depth: int, reference: bool = False,
                 sampling: SamplingParams = GREEDY):
        if max_depth + 1 != runner.cache.width:
            raise ValueError(f"max_depth {max_depth} does not match the runner's commit width "
                             f"{runner.cache.width} (= max_depth + 1)")
        self.runner = runner
        self.max_depth = max_depth
        self.reference = reference
        self.sampling = sampling
        self.aux_width = 3 * runner.model.config.hidden_size
        self.steps: dict[tuple[int, int], VerifyStep] = {}  # (window, N) -> graph, built on first use
        self.decode_steps = {w: DecodeStep(runner.model, max_depth, w, reference, sampling)
                             for w in runner.attention_windows}
        self.commits_in_graph = runner.model.kernels == "cpu"  # == VerifyStep.commits of every verify graph

    def verify_step(self, window: int, nodes: int) -> VerifyStep:
        """The verify graph of attention window ``window`` for trees of ``nodes`` = N rows (one graph per
        (window, N): each is compiled once and called without the per-call compile check,
        eagle_ms/models/fixed_call.py)."""
        key = (window, nodes)
        if key not in self.steps:
            self.steps[key] = VerifyStep(self.runner.model, self.max_depth, window, self.reference, self.sampling)
            assert self.steps[key].commits == self.commits_in_graph
        return self.steps[key]

    def _call(self, tree: TreeInputs):
        """(result, accepted_aux[, argmax]) of the window's graph; nothing is read back here."""
        width = self.runner.attention_width(tree.committed_len + tree.num_nodes)
        committed = Tensor(np.array([tree.committed_len], np.int32))
        return self.verify_step(width, tree.num_nodes)(tree.tokens, tree.position_ids, tree.tree_mask, tree.paths,
                                                       tree.path_lengths, committed)

    def verify(self, tree: TreeInputs | TreeTensors) -> DeviceStep:
        """One verify step of ``tree`` (tensorised at the runner's committed length L); commits A + 1 slots.

        Raises ValueError for a tree of another committed length, paths not D+1 wide, an out-of-vocabulary
        host token, or a tree that does not fit the cache (before any call).
        """
        if isinstance(tree, TreeTensors):
            tree = TreeInputs.from_tree(tree)
        if tree.committed_len != self.runner.length:
            raise ValueError(f"tree tensorised at committed length {tree.committed_len}, but the teacher "
                             f"cache holds {self.runner.length}")
        if tuple(tree.paths.shape[2:]) != (self.max_depth + 1,):
            raise ValueError(f"tree paths have shape {tuple(tree.paths.shape)}; need [1, P, {self.max_depth + 1}]")
        if tree.host is not None:
            check_token_ids(tree.host.tokens, self.runner.vocab_size, "draft tree")
        return self.read_step(self._call(tree), tree.host)

    def decode(self, root: int) -> DeviceStep:
        """A teacher-only step (``DecodeStep``): ``root`` goes into the cache at L, the bonus token is the
        teacher's choice after it. Raises ValueError for an out-of-vocabulary root or a full cache.
        Reference mode checks the packed result against ``greedy_accept`` of the root-only tree."""
        length = self.runner.length
        check_token_ids(np.array([root]), self.runner.vocab_size, "decode root")
        graph = self.decode_steps[self.runner.attention_width(length + 1)]  # ValueError when the cache is full
        host = tensorize(_root_only(root), length, 0, self.max_depth) if self.reference else None
        outputs = graph(Tensor(np.array([[root]], np.int32)), Tensor(np.array([length], np.int32)))
        return self.read_step(outputs, host)

    def read_step(self, outputs, host: TreeTensors | None) -> DeviceStep:
        """Read the packed result (the one host read of a step); in reference mode check it against
        ``greedy_accept`` on the graph's per-node choices when the ``host`` tree is known; advance the
        runner's committed length by A + 1; a path out of slot order has its K/V rows moved by the graph
        (``commits_in_graph``) or here by the model's CacheMover."""
        (packed,) = unpack_result(outputs[0].asnumpy())
        argmax = outputs[2].asnumpy()[0] if self.reference else None
        if argmax is not None and host is not None:
            _check_against_host(host, argmax, packed)
        a = packed.accepted_len
        copied = self.runner.cache.commit_by_path(packed.node_ids, moved=self.commits_in_graph)
        return DeviceStep(a, packed.tokens, packed.node_ids, copied, outputs[0], outputs[1], argmax)

    def aux_rows(self, step: DeviceStep) -> np.ndarray:
        """Host copy of the accepted nodes' aux features [A+1, 3H] (for host-side drafters' observe)."""
        return step.accepted_aux.asnumpy()[0, :step.accepted_len + 1]

    def warm_up(self, query_sizes) -> None:
        """Compile every (window, N) graph for N in ``query_sizes`` (N <= window; N = 1 is ``DecodeStep``);
        leaves the cache empty.

        Each call ends exactly at its window (an all-padding tree, or a decode at slot window - 1); it
        writes K/V beyond the committed region only (identity commit rows)."""
        for width in self.runner.attention_windows:
            for n in sorted(set(query_sizes)):
                if n == 1:
                    last_slot = Tensor(np.array([width - 1], np.int32))
                    self.decode_steps[width](Tensor(np.zeros((1, 1), np.int32)), last_slot)
                elif n <= width:
                    self._call(TreeInputs.from_tree(tensorize(_root_only(0), width - n, n - 1, self.max_depth)))
        self.runner.reset()


def _root_only(root: int) -> DraftTree:
    return DraftTree(root, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))


def _check_against_host(t: TreeTensors, argmax: np.ndarray, packed) -> None:
    """Raise DeviceAcceptMismatch unless the packed step equals greedy_accept(t, argmax)."""
    host = greedy_accept(t, argmax)
    if (packed.accepted_len != host.accepted_len or not np.array_equal(packed.node_ids, host.node_ids)
            or not np.array_equal(packed.tokens, host.tokens)):
        raise DeviceAcceptMismatch(
            f"device acceptance A={packed.accepted_len} node_ids {packed.node_ids.tolist()} tokens "
            f"{packed.tokens.tolist()} != greedy_accept A={host.accepted_len} node_ids "
            f"{host.node_ids.tolist()} tokens {host.tokens.tolist()}")
