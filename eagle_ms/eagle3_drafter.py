"""The EAGLE-3 drafter: draft Cells + dynamic tree + the draft's own static KV cache (Drafter protocol).

Alignment (batch 1). The teacher has committed length L and ``root`` (the token at position L, chosen,
not yet in the teacher cache). The draft has committed the L pairs j = 0..L-1, pair j = (teacher
feature f_j, token t_{j+1}) at RoPE position j; the last one is (f_{L-1}, root), and its output
(top-k + hidden) is kept on the host as the tree's depth-1 distribution, and on the device by every extend
call (``Eagle3Draft.root_pair``), so a device tree step can start from it without the host.

Draft cache layout, capacity S = X + C (X = scratch size, C = teacher capacity):

    slots [0, X)         scratch: expansion rows (depth t, frontier row r -> (t-1)*k + r) and the
                         padding rows of ``extend`` calls (row i -> i). Never committed, never seen by
                         a committed row, overwritten freely.
    slots [X, X+L)       committed pairs: pair j at slot X + j (written only by ``extend`` rows of real pairs)
    slots [X+L, X+C)     free (future pairs)

Scratch comes first so that attention can read only slots [0, X + w) for the teacher's attention
windows w (``runtime.attention_windows``; the mask width selects the window, one graph per (N, width)),
exactly as the teacher reads [0, w). Worked example: X = 36, windows (256, 512, C=2048), L = 300 ->
expansion calls read slots [0, 36 + 512).

Calls:
  * begin: the prompt's pairs (f_j, prompt[j+1]) ... (f_{P-1}, root) in chunks of ``prefill_chunk`` rows;
  * observe(committed [A+1], aux [A+1, 3H], next_root): pairs (f_L, d_1) ... (f_{L+A}, bonus) in ONE
    call of Dmax+1 rows (padding rows go to scratch); after teacher-only fallback steps the tokens of
    several steps come at once, in ceil(n / (Dmax+1)) calls;
  * propose(root): ``drafting.build_tree`` with one ``expand`` call of k rows per depth (the host path;
    ``DraftTreeStep`` drafts the same tree in one device call, ``follow_device`` hands back to the host).
    Frontier node at depth t: token = its own, feature = its parent's output hidden, position L-1+t, slot in scratch;
    it sees the committed pairs, its ancestors' scratch slots and itself.

``context_window`` W (``speculative.draft_window``): every row sees only the last W committed pairs (up
to and including itself for extend rows; pairs [L-W, L) for expansion rows); positions are unchanged.
Worked example: L = 5, W = 2 -> an expansion row sees pairs 3, 4 (slots X+3, X+4) + its ancestors + itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mindspore import Tensor

from eagle_ms.drafting import TreeBuild, TreeParams, build_tree
from eagle_ms.models.eagle3 import Eagle3Draft, Eagle3Expand
from eagle_ms.tree import DraftTree, chain_first
from eagle_ms.config import check_draft_window

__all__ = ["Eagle3Drafter", "scratch_size"]


@dataclass(frozen=True)
class RootPair:
    """The draft's output at its last committed pair: the tree's depth-1 distribution and feature."""

    token: int             # the pair's token: the next tree's root
    logprob: np.ndarray    # [K] top-K draft log-probabilities, descending
    target_ids: np.ndarray  # [K] their target-vocabulary ids
    hidden: np.ndarray     # [H] output hidden state (the depth-1 nodes' input feature)


@dataclass(frozen=True)
class Expansion:
    """The last expand call of the current tree, read by the next depth's call."""

    hidden: np.ndarray          # [k, H] output hidden state per frontier row
    slots: np.ndarray           # [k] scratch slots the rows wrote
    scratch_visible: np.ndarray  # [k, X] bool: the scratch slots each row saw (its ancestors and itself)


def scratch_size(params: TreeParams, prefill_chunk: int) -> int:
    """Scratch slots a drafter needs: expansions, and the padding rows of extend calls."""
    return max(params.scratch_slots, prefill_chunk, params.max_depth + 1)


class Eagle3Drafter:
    """Drafter protocol of ``eagle_ms.generate`` over an ``Eagle3Draft`` (batch 1).

    ``committed_capacity`` C: the teacher's capacity. ``attention_windows``: the teacher runner's attention
    windows (ascending, ending with C); None = always the whole cache. Built from a config by
    eagle_ms/runtime.py (``build_eagle3_drafter``). The draft's in-graph top-K may exceed
    ``params.top_k`` (the first k of the sorted top-K are used), so one compiled draft serves several k.
    """

    def __init__(self, draft: Eagle3Draft, params: TreeParams, committed_capacity: int, prefill_chunk: int,
                 context_window: int | None = None, early_stop: bool = True,
                 expand_cell: Eagle3Expand | None = None, attention_windows=None):
        if draft.batch != 1:
            raise ValueError(f"Eagle3Drafter drives batch 1; the draft was built for batch {draft.batch}")
        check_draft_window(context_window)
        if draft.top_k < params.top_k:
            raise ValueError(f"config key 'speculative.top_k' = {params.top_k}: the draft graph was built "
                             f"with top_k {draft.top_k} (its in-graph top-K must be >= k)")
        self.scratch = draft.capacity - committed_capacity  # X
        params.check_fits(draft.config.draft_vocab_size, committed_capacity, self.scratch)
        need = scratch_size(params, prefill_chunk)
        if self.scratch < need:
            raise ValueError(f"draft cache capacity {draft.capacity} < teacher capacity {committed_capacity} + "
                             f"scratch {need} (speculative.max_depth/top_k, prefill_chunk)")
        if expand_cell is not None and expand_cell.draft is not draft:
            raise ValueError("expand_cell wraps another draft")
        # one Eagle3Expand per draft keeps its compiled graph: pass it when making several drafters
        self.draft, self.expand_cell = draft, expand_cell or Eagle3Expand(draft)
        self.params, self.context_window, self.early_stop = params, context_window, early_stop
        self.capacity, self.committed_capacity, self.prefill_chunk = draft.capacity, committed_capacity, prefill_chunk
        self.attention_windows = tuple(w for w in sorted(set(attention_windows or ())) if w < committed_capacity) \
            + (committed_capacity,)
        self.length = 0  # committed pairs (== the teacher's committed length)
        self.last: TreeBuild | None = None
        self._root: RootPair | None = None
        self._prev: Expansion | None = None

    # ------------------------------------------------------------------ protocol

    def begin(self, prompt_ids, prompt_aux, root: int) -> None:
        """Prompt tokens [P], teacher aux features [P, 3H], the first chosen token."""
        prompt_ids = np.asarray(prompt_ids, np.int64)
        prompt_aux = np.asarray(prompt_aux)
        if prompt_aux.shape[0] != prompt_ids.size:
            raise ValueError(f"prompt_aux has {prompt_aux.shape[0]} rows for {prompt_ids.size} prompt tokens")
        self.length, self._root, self.last = 0, None, None
        tokens = np.append(prompt_ids[1:], root)  # pair j = (f_j, t_{j+1})
        for start in range(0, tokens.size, self.prefill_chunk):
            stop = start + self.prefill_chunk
            self._extend(tokens[start:stop], prompt_aux[start:stop], self.prefill_chunk)

    def observe(self, committed, aux, next_root: int) -> None:
        """Committed tokens [n] (root first; n = A+1, or more after fallback steps), their teacher
        features [n, 3H], the next root (the bonus token)."""
        committed = np.asarray(committed, np.int64)
        tokens = np.append(committed[1:], next_root)
        width = self.params.max_depth + 1
        for start in range(0, tokens.size, width):
            self._extend(tokens[start:start + width], np.asarray(aux)[start:start + width], width)

    def propose(self, root: int, params: TreeParams | None = None) -> DraftTree:
        """The tree rooted at ``root``, grown with ``params`` (None: this drafter's own; a shallower tree of
        ``TreeParams.shallow`` needs no more scratch slots)."""
        if self._root is None or int(root) != self._root.token:
            raise RuntimeError(f"propose(root={root}) but the draft's last committed pair holds token "
                               f"{None if self._root is None else self._root.token} (begin/observe missing?)")
        params = self.params if params is None else params
        if params.max_depth > self.params.max_depth or params.top_k > self.params.top_k:
            raise ValueError(f"tree max_depth {params.max_depth} / top_k {params.top_k} exceed the drafter's "
                             f"{self.params.max_depth} / {self.params.top_k}")
        self.last = build_tree(int(root), self._root.logprob, self._root.target_ids, self._expand, params,
                               self.early_stop)
        return chain_first(self.last.tree)  # the likeliest chain in slot order: its commit needs no copy

    @property
    def root_token(self) -> int | None:
        """The last committed pair's token (the next tree's root) when the host holds the root pair."""
        return None if self._root is None else self._root.token

    def follow_device(self, length: int, read_root: bool = False) -> None:
        """Take over from device tree steps (eagle_ms/models/draft_tree_step.py), which extended this draft's
        cache to ``length`` committed pairs and kept the root pair on the device (``Eagle3Draft.root_pair``).
        ``read_root``: copy that pair to the host, so ``propose`` (the reference, eagle_ms/draft_tree_check.py)
        continues from it; otherwise ``propose`` refuses until the next ``begin``/``observe``."""
        if not 1 <= length <= self.committed_capacity:
            raise ValueError(f"device draft length {length} outside [1, capacity {self.committed_capacity}]")
        self.length, self._root = length, None
        if read_root:
            store = self.draft.root_pair
            self._root = RootPair(int(store.token.asnumpy()[0]), store.logprob.asnumpy()[0],
                                  store.target_ids.asnumpy()[0], store.hidden.asnumpy()[0])

    # ------------------------------------------------------------------ calls

    def _mask_width(self, end: int) -> int:
        """Mask width (slots read) for a call touching committed pairs [0, end): X + the smallest window >= end."""
        for w in self.attention_windows:
            if w >= end:
                return self.scratch + w
        raise ValueError(f"draft cache full: {end} pairs needed, capacity {self.committed_capacity}")

    def _visible(self, upto: np.ndarray, width: int) -> np.ndarray:
        """[n, width] bool: row i sees committed pairs [lo_i, upto_i) (lo by ``draft_window``)."""
        pair = np.arange(width)[None, :] - self.scratch  # column -> pair index (negative: scratch)
        upto = np.asarray(upto)[:, None]
        lo = 0 if self.context_window is None else np.maximum(upto - self.context_window, 0)
        return (pair >= lo) & (pair < upto)

    def _extend(self, tokens: np.ndarray, features: np.ndarray, rows: int, end: int | None = None) -> None:
        """Commit n <= rows pairs in one call of ``rows`` rows; keep the last pair's output.

        ``end`` (warm-up only) forces the attention window chosen for committed pairs [0, end).
        """
        n, L = tokens.size, self.length
        if L + n > self.committed_capacity:
            raise ValueError(f"draft cache full: committed {L} + {n} pairs > capacity {self.committed_capacity}")
        width = self._mask_width(L + n if end is None else end)
        i = np.arange(rows)
        real = i < n
        ids = np.zeros(rows, np.int32)
        ids[:n] = tokens
        feats = np.zeros((rows, features.shape[-1]), np.float32)
        feats[:n] = features
        positions = np.where(real, L + i, L).astype(np.int32)
        slots = np.where(real, self.scratch + L + i, i).astype(np.int32)  # padding rows -> scratch slot i
        allowed = self._visible(np.where(real, L + i + 1, 0), width)  # a real row sees up to itself
        allowed[i, slots] = True  # padding rows: only themselves
        last_row = Tensor(np.array([n - 1], np.int32))  # kept on the device too (Eagle3Draft.root_pair)
        logprob, top_ids, hidden = self.draft(*self._tensors(ids, feats, positions, slots, allowed), last_row)
        self.length = L + n
        self._root = RootPair(int(tokens[-1]), logprob.asnumpy()[0, n - 1], top_ids.asnumpy()[0, n - 1],
                              hidden.asnumpy()[0, n - 1])

    def _expand(self, depth: int, parent_rows: np.ndarray, tokens: np.ndarray, end: int | None = None):
        """One expand call for the k frontier nodes of ``depth`` (see drafting.ExpandFn)."""
        k, L, x = self.params.top_k, self.length, self.scratch
        slots = ((depth - 1) * k + np.arange(k)).astype(np.int32)
        if depth == 1:
            feats = np.repeat(self._root.hidden[None], k, axis=0)
            scratch = np.zeros((k, x), bool)
        else:
            prev = self._prev
            feats = prev.hidden[parent_rows]
            scratch = prev.scratch_visible[parent_rows]
            scratch[np.arange(k), prev.slots[parent_rows]] = True  # the parent itself
        mine = scratch.copy()
        mine[np.arange(k), slots] = True
        allowed = self._visible(np.full(k, L), self._mask_width(max(L, 1) if end is None else end))
        allowed[:, :x] = mine
        positions = np.full(k, L - 1 + depth, np.int32)
        logprob, ids, hidden = self.expand_cell(*self._tensors(tokens, feats, positions, slots, allowed))
        self._prev = Expansion(hidden.asnumpy()[0], slots, mine)
        return logprob.asnumpy()[0], ids.asnumpy()[0]

    @staticmethod
    def _tensors(ids, feats, positions, slots, allowed):
        return (Tensor(np.asarray(ids, np.int32)[None]), Tensor(np.asarray(feats, np.float32)[None]),
                Tensor(np.asarray(positions, np.int32)[None]), Tensor(np.asarray(slots, np.int32)[None]),
                Tensor(np.asarray(allowed, bool)[None]))

    def warm_up(self) -> None:
        """Compile every graph a generation can use: extend (prompt chunk, Dmax+1 rows) and expand (k rows)
        for each attention window. Writes only slots that are rewritten before being read; leaves the
        drafter empty."""
        aux_width = 3 * self.draft.config.target_hidden_size
        one = (np.zeros(1, np.int64), np.zeros((1, aux_width), np.float32))
        for w in self.attention_windows:
            self.length = 0
            self._extend(*one, self.prefill_chunk, end=w)
            self._extend(*one, self.params.max_depth + 1, end=w)
            if self.params.max_depth > 1:
                self._expand(1, np.zeros(self.params.top_k, np.int64), np.zeros(self.params.top_k, np.int64), end=w)
        self.length, self._root, self._prev, self.last = 0, None, None, None
