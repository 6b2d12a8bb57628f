"""Narrow a trained EAGLE-3 draft to a smaller draft vocabulary (``eagle-ms narrow-draft``).

Every drafted depth runs the draft's LM head, ``lm_head.weight`` [Vd, H]: for the demo draft trained over
2 048 draft tokens it was two fifths of the weights a depth reads, while its 1 981 training answers use 577
distinct tokens (eagle_ms/assets/demo/MODEL_CARD.md; docs/results.md §1t). A draft over the N most frequent
of them drafts the same tokens with a smaller head.

Narrowing keeps, for every target id of the new vocabulary (``eagle-ms build-vocab --draft-vocab-size N``),
the LM-head row the draft already has for it, in the new vocabulary's (ascending target id) order; every
other weight is unchanged. So a narrowed draft's logit for a kept token is bit for bit the old draft's
logit for that token; only the log-softmax normaliser changes (it sums over the kept tokens only), which
shifts every score of a row by the same amount.

The new vocabulary must be a subset of the draft's: a target id the draft has no row for would need a row
made up, which is a remap (the failure ``vocab.py``'s "no silent remap" rule guards against), not a
narrowing. A narrowed draft can then be fine-tuned with ``eagle-ms train-draft --init OUT --vocab FILE``
(the same vocabulary, so the warm start's equality check holds).
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from eagle_ms.draft_weights import load_draft_checkpoint, save_draft_checkpoint
from eagle_ms.models.eagle3 import Eagle3Config
from eagle_ms.safetensors_format import SafetensorsFile
from eagle_ms.train.vocab import DraftVocab, load_vocab
from eagle_ms.weights import SINGLE_FILE

# safetensors dtype tags -> the export dtypes of ``save_draft_checkpoint``
EXPORT_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}


def narrow_draft_state(cfg: Eagle3Config, state: dict, vocab: DraftVocab,
                       source: str) -> tuple[Eagle3Config, dict]:
    """(config, state) of the draft ``state`` narrowed to ``vocab`` (module doc).

    ``state`` is a checked draft state (``draft_weights.load_draft_checkpoint``: d2t [Vd] int64, t2d [V]
    bool, lm_head.weight [Vd, H]). Raises ValueError naming ``source`` when the vocabularies are for
    different teachers or ``vocab`` holds target ids the draft cannot draft.
    """
    theirs = DraftVocab(np.asarray(state["d2t"], np.int64), np.asarray(state["t2d"], bool))
    if vocab.t2d.size != theirs.t2d.size:
        raise ValueError(f"draft {source} is for {theirs.t2d.size} target ids, the vocabulary for {vocab.t2d.size}")
    wanted = vocab.used                                        # [N] target ids, ascending
    missing = wanted[~theirs.t2d[wanted]]
    if missing.size:
        raise ValueError(f"the vocabulary has {missing.size} target ids the draft {source} cannot draft (first: "
                         f"{missing[:5].tolist()}): narrowing only drops tokens; build the vocabulary from data "
                         f"whose tokens the draft covers, or retrain the draft")
    rows = np.searchsorted(theirs.used, wanted)                # [N] the draft ids of those target ids
    narrowed = dict(state)
    narrowed["lm_head.weight"] = np.ascontiguousarray(state["lm_head.weight"][rows])  # [N, H]
    narrowed["d2t"] = vocab.d2t.astype(np.int64)
    narrowed["t2d"] = vocab.t2d.astype(bool)
    return dataclasses.replace(cfg, draft_vocab_size=int(wanted.size)), narrowed


def narrow_draft(draft_dir: str, vocab_path: str, out_dir: str, dtype: str | None = None) -> dict:
    """Read the draft directory ``draft_dir``, narrow it to the vocabulary file ``vocab_path`` and write the
    result to ``out_dir`` (``model.safetensors`` + ``config.json``) in ``dtype`` (default: the draft's own
    LM-head dtype, so fp16 weights stay bit for bit). Returns a summary dict."""
    if os.path.realpath(out_dir) == os.path.realpath(draft_dir):
        raise ValueError(f"--out {out_dir} is the draft being narrowed: write the narrowed draft elsewhere")
    cfg, state = load_draft_checkpoint(draft_dir)
    vocab, _, _ = load_vocab(vocab_path)  # validated on load
    if dtype is None:
        tag = SafetensorsFile(os.path.join(draft_dir, SINGLE_FILE)).tensors["lm_head.weight"][0]
        dtype = EXPORT_DTYPES.get(tag, "float32")
    new_cfg, new_state = narrow_draft_state(cfg, state, vocab, draft_dir)
    save_draft_checkpoint(new_state, new_cfg, out_dir, dtype=dtype)
    return {"draft": draft_dir, "vocab": vocab_path, "out": out_dir, "dtype": dtype,
            "draft_vocab_size": [cfg.draft_vocab_size, new_cfg.draft_vocab_size],
            "lm_head_params": [cfg.draft_vocab_size * cfg.hidden_size, new_cfg.draft_vocab_size * cfg.hidden_size]}
