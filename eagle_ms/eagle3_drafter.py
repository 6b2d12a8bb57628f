"""The EAGLE-3 drafter: draft Cells + dynamic tree + the draft's own static KV cache (Drafter protocol).

Alignment (batch 1). The teacher has committed length L and ``root`` (the token at position L, chosen,
not yet in the teacher cache). The draft has committed the L pairs j = 0..L-1, pair j = (teacher
feature f_j, token t_{j+1}) at slot j and RoPE position j; the last one is (f_{L-1}, root), and its
output (top-k + hidden) is kept on the host as the tree's depth-1 distribution.

Draft cache layout, capacity S = C + scratch (C = teacher capacity):

    slots [0, L)       committed pairs (written only by ``extend`` rows of real pairs)
    slots [L, C)       free (future pairs)
    slots [C, S)       scratch: expansion rows (depth t, frontier row r -> C + (t-1)*k + r) and the
                       padding rows of ``extend`` calls (row i -> C + i). Never committed, never seen by
                       a committed row, overwritten freely.

Calls:
  * begin: the prompt's pairs (f_j, prompt[j+1]) ... (f_{P-1}, root) in chunks of ``prefill_chunk`` rows;
  * observe(committed [A+1], aux [A+1, 3H], next_root): pairs (f_L, d_1) ... (f_{L+A}, bonus) in ONE
    call of Dmax+1 rows (padding rows go to scratch);
  * propose(root): ``drafting.build_tree`` with one ``expand`` call of k rows per depth. Frontier node
    at depth t: token = its own, feature = its parent's output hidden, position L-1+t, slot in scratch;
    it sees the committed window, its ancestors' scratch slots and itself.

``window`` W (``speculative.draft_window``): every row sees only the last W committed pairs (up to
and including itself for extend rows; [L-W, L) for expansion rows); positions are unchanged.
Worked example: L = 5, W = 2 -> an expansion row sees slots 3, 4 + its ancestors + itself.
"""
from __future__ import annotations

import numpy as np

from mindspore import Tensor

from eagle_ms.drafting import TreeDraft, TreeParams, build_tree
from eagle_ms.models.eagle3 import Eagle3Draft, Eagle3Expand
from eagle_ms.tree import DraftTree


def scratch_size(params: TreeParams, prefill_chunk: int) -> int:
    """Scratch slots a drafter needs: expansions, and the padding rows of extend calls."""
    return max(params.scratch_slots, prefill_chunk, params.max_depth + 1)


class Eagle3Drafter:
    """Drafter protocol of ``eagle_ms.generate`` over an ``Eagle3Draft`` (batch 1)."""

    def __init__(self, draft: Eagle3Draft, params: TreeParams, committed_capacity: int, prefill_chunk: int,
                 window: int | None = None, early_stop: bool = True):
        if draft.batch != 1:
            raise ValueError(f"Eagle3Drafter drives batch 1; the draft was built for batch {draft.batch}")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"config key 'speculative.draft_window' = {window!r}: must be an integer >= 1")
        if draft.top_k != params.top_k:
            raise ValueError(f"config key 'speculative.top_k' = {params.top_k}: the draft graph was built "
                             f"with top_k {draft.top_k}")
        params.check_fits(draft.config.draft_vocab_size, committed_capacity,
                          draft.capacity - committed_capacity)
        need = committed_capacity + scratch_size(params, prefill_chunk)
        if draft.capacity < need:
            raise ValueError(f"draft cache capacity {draft.capacity} < teacher capacity {committed_capacity} + "
                             f"scratch {need - committed_capacity} (speculative.max_depth/top_k, prefill_chunk)")
        self.draft, self.expand_cell = draft, Eagle3Expand(draft)
        self.params, self.window, self.early_stop = params, window, early_stop
        self.capacity, self.committed_capacity, self.prefill_chunk = draft.capacity, committed_capacity, prefill_chunk
        self.length = 0  # committed pairs (== the teacher's committed length)
        self.last: TreeDraft | None = None
        self._root = None  # (token, top-k logprob [K], top-k target ids [K], hidden [H]) of the last pair
        self._prev = None  # per expand call: (hidden [k, H], slots [k], scratch visibility [k, S])

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
        """Committed tokens [A+1] (root first), their teacher features [A+1, 3H], the bonus token."""
        committed = np.asarray(committed, np.int64)
        tokens = np.append(committed[1:], next_root)
        width = self.params.max_depth + 1
        for start in range(0, tokens.size, width):
            self._extend(tokens[start:start + width], np.asarray(aux)[start:start + width], width)

    def propose(self, root: int) -> DraftTree:
        if self._root is None or int(root) != self._root[0]:
            raise RuntimeError(f"propose(root={root}) but the draft's last committed pair holds token "
                               f"{None if self._root is None else self._root[0]} (begin/observe missing?)")
        _, logprob, ids, _ = self._root
        self.last = build_tree(int(root), logprob, ids, self._expand, self.params, self.early_stop)
        return self.last.tree

    # ------------------------------------------------------------------ calls

    def _visible(self, upto: np.ndarray) -> np.ndarray:
        """[n, S] bool: row i sees committed slots [lo_i, upto_i) (lo by the window)."""
        cols = np.arange(self.capacity)[None, :]
        upto = np.asarray(upto)[:, None]
        lo = 0 if self.window is None else np.maximum(upto - self.window, 0)
        return (cols < upto) & (cols >= lo)

    def _extend(self, tokens: np.ndarray, features: np.ndarray, width: int) -> None:
        """Commit n <= width pairs in one call of ``width`` rows; keep the last pair's output."""
        n, L = tokens.size, self.length
        if L + n > self.committed_capacity:
            raise ValueError(f"draft cache full: committed {L} + {n} pairs > capacity {self.committed_capacity}")
        rows = np.arange(width)
        real = rows < n
        ids = np.zeros(width, np.int32)
        ids[:n] = tokens
        feats = np.zeros((width, features.shape[-1]), np.float32)
        feats[:n] = features
        positions = np.where(real, L + rows, L).astype(np.int32)
        slots = np.where(real, L + rows, self.committed_capacity + rows).astype(np.int32)
        allowed = self._visible(np.where(real, L + rows + 1, 0))  # row i sees up to and incl. itself
        allowed[rows, slots] = True  # padding rows: only themselves
        logprob, top_ids, hidden = self.draft(*self._tensors(ids, feats, positions, slots, allowed))
        self.length = L + n
        self._root = (int(tokens[-1]), logprob.asnumpy()[0, n - 1], top_ids.asnumpy()[0, n - 1],
                      hidden.asnumpy()[0, n - 1])

    def _expand(self, depth: int, parent_rows: np.ndarray, tokens: np.ndarray):
        """One expand call for the k frontier nodes of ``depth`` (see drafting.ExpandFn)."""
        k, L, base = self.params.top_k, self.length, self.committed_capacity
        slots = (base + (depth - 1) * k + np.arange(k)).astype(np.int32)
        if depth == 1:
            feats = np.repeat(self._root[3][None], k, axis=0)
            scratch = np.zeros((k, self.capacity), bool)
        else:
            hidden, prev_slots, prev_scratch = self._prev
            feats = hidden[parent_rows]
            scratch = prev_scratch[parent_rows].copy()
            scratch[np.arange(k), prev_slots[parent_rows]] = True  # the parent itself
        mine = scratch.copy()
        mine[np.arange(k), slots] = True
        allowed = self._visible(np.full(k, L)) | mine
        positions = np.full(k, L - 1 + depth, np.int32)
        logprob, ids, hidden = self.expand_cell(*self._tensors(tokens, feats, positions, slots, allowed))
        self._prev = (hidden.asnumpy()[0], slots, mine)
        return logprob.asnumpy()[0], ids.asnumpy()[0]

    @staticmethod
    def _tensors(ids, feats, positions, slots, allowed):
        return (Tensor(np.asarray(ids, np.int32)[None]), Tensor(np.asarray(feats, np.float32)[None]),
                Tensor(np.asarray(positions, np.int32)[None]), Tensor(np.asarray(slots, np.int32)[None]),
                Tensor(np.asarray(allowed, bool)[None]))

    def warm_up(self) -> None:
        """Compile the extend graphs (prompt chunk, Dmax+1) and the expand graph; leaves the drafter empty."""
        self.begin(np.zeros(1, np.int64), np.zeros((1, 3 * self.draft.config.target_hidden_size), np.float32), 0)
        self.observe(np.zeros(1, np.int64), np.zeros((1, 3 * self.draft.config.target_hidden_size)), 0)
        if self.params.max_depth > 1:
            self._prev = None
            self._expand(1, np.zeros(self.params.top_k, np.int64), np.zeros(self.params.top_k, np.int64))
        self.length, self._root, self._prev, self.last = 0, None, None, None
