"""Host-side range check of token ids before they reach an embedding gather (an out-of-range index is
an error on CPU and undefined behaviour on an accelerator). Ids are never clipped.

Every id that enters the model from outside it passes ``check_token_ids``: prompts (eagle_ms/teacher.py
``prefill``, whatever produced them: ``--prompt-ids``, a tokenizer, benchmark or regeneration data),
draft-tree tokens (``TeacherRunner.verify``), regeneration prompts (eagle_ms/train/regen_batch.py).
"""
from __future__ import annotations

import numpy as np


def check_token_ids(ids, vocab_size: int, what: str = "prompt") -> np.ndarray:
    """``ids`` as an int32 array [n]; ValueError naming the first id outside [0, vocab_size) and its position.

    Example: check_token_ids([1, -5, 3], 8000) -> "prompt token at position 1 is -5: outside the model
    vocabulary [0, 8000)".
    """
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"{what} token ids must be a 1-D sequence, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{what} token ids must be integers, got dtype {arr.dtype}")
    bad = np.flatnonzero((arr < 0) | (arr >= vocab_size))
    if bad.size:
        pos = int(bad[0])
        more = f" ({bad.size} ids are out of range)" if bad.size > 1 else ""
        raise ValueError(f"{what} token at position {pos} is {int(arr[pos])}: outside the model vocabulary "
                         f"[0, {vocab_size}){more}")
    return arr.astype(np.int32)


def parse_token_ids(text: str, flag: str = "--prompt-ids") -> list[int]:
    """``"1,2,3"`` -> [1, 2, 3]; ValueError saying what is wrong with an empty list or a non-integer item."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise ValueError(f"{flag} is empty: give comma-separated token ids, e.g. {flag} 1,2,3")
    out = []
    for pos, item in enumerate(items):
        try:
            out.append(int(item))
        except ValueError:
            raise ValueError(f"{flag} item {pos} is {item!r}: not an integer (expected e.g. {flag} 1,2,3)") from None
    return out
