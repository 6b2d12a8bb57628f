"""FusedTreeStep: the draft graph and the verify graph of one speculative step as one graph call.

Contract (B batch, D = max_depth, N = budget + 1; shapes of eagle_ms/models/draft_tree_step.py and
eagle_ms/models/verify_step.py):

    construct(result [B, 2D+3] i32, accepted_aux [B, D+1, 3Ht], committed_len [B] i32)
      -> VerifyStep's outputs for the tree drafted at L' = committed_len + A + 1 (A = result[:, 0]):
         (result [B, 2D+3] i32, accepted_aux [B, D+1, 3Ht][, argmax [B, N] i32 when reference])
         followed, when built with ``with_tree``, by the DraftTreeStep's twelve tree tensors (OUTPUT_NAMES)

Inputs are the previous step's outputs (or ``no_step_result`` and zero aux rows with A = -1), so the tree
tensors never leave the graph in performance mode and the host launches one graph per step instead of two.
Both halves must be built for the same attention window W: the verify half writes slots [L', L' + N) and
needs L' + N <= W, and a draft window larger than the smallest one holding L' only reads more masked
slots (the result is the same). Measured against two calls: docs/architecture.md §"One fused draft+verify
graph".
"""
from __future__ import annotations

from mindspore import nn

from eagle_ms.models.draft_tree_step import OUTPUT_NAMES
from eagle_ms.models.fixed_call import FixedSignatureCall

# the DraftTreeStep outputs the verify graph takes, by position
TOKENS, POSITION_IDS, TREE_MASK, PATHS, PATH_LENGTHS = (
    OUTPUT_NAMES.index(name) for name in ("tokens", "position_ids", "tree_mask", "paths", "path_lengths"))


class FusedTreeStep(FixedSignatureCall, nn.Cell):
    """DraftTreeStep then VerifyStep in one graph (module doc). ``with_tree``: also output the tree tensors
    (reference mode reads them back to check them against the host path)."""

    def __init__(self, draft_step, verify_step, with_tree: bool = False):
        super().__init__(auto_prefix=False)  # the teacher's and the draft's parameter names stay as they are
        if draft_step.window != verify_step.window:
            raise ValueError(f"draft window {draft_step.window} != verify window {verify_step.window}: "
                             "build both halves for the same attention window")
        self.draft_step, self.verify_step, self.with_tree = draft_step, verify_step, with_tree

    def construct(self, result, accepted_aux, committed_len):
        tree = self.draft_step(result, accepted_aux, committed_len)
        length = tree[POSITION_IDS][:, 0]  # the root's position: L' = committed_len + A + 1
        verified = self.verify_step(tree[TOKENS], tree[POSITION_IDS], tree[TREE_MASK], tree[PATHS],
                                    tree[PATH_LENGTHS], length)
        if self.with_tree:
            return verified + tree
        return verified
