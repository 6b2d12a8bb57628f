"""Narrowing a draft to a smaller draft vocabulary (eagle_ms.train.narrow_vocab, ``eagle-ms narrow-draft``).

The narrowed draft is checked against the original read back independently: each kept target id's LM-head
row is looked up through a dict built from the original's d2t, and the narrowed draft's log-probabilities
(the real draft Cell) against a NumPy float64 log-softmax of the original logits restricted to the kept ids.
"""
import json
import re

import numpy as np
import pytest

from mindspore import Tensor

from eagle_ms.config import ModelConfig
from eagle_ms.draft_weights import (CheckpointError, default_draft_config, load_draft_checkpoint, load_draft_state,
                                    random_draft_state, save_draft_checkpoint)
from eagle_ms.models.eagle3 import Eagle3Draft
from eagle_ms.train.narrow_vocab import narrow_draft, narrow_draft_state
from eagle_ms.train.vocab import load_vocab, save_vocab, vocab_from_counts
from test_cli import run_cli

TEACHER = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2)
WIDE = default_draft_config(TEACHER, draft_vocab_size=24, intermediate_size=48)


def wide_draft(tmp_path, dtype="float16"):
    """A saved draft over 24 seeded random target ids; returns (dir, its state as read back)."""
    out = str(tmp_path / "wide")
    save_draft_checkpoint(random_draft_state(WIDE, seed=3), WIDE, out, dtype)
    return out, load_draft_checkpoint(out)[1]


def subset_vocab(tmp_path, state, n, name="narrow.safetensors"):
    """A vocabulary file of the n most 'frequent' of the draft's target ids (seeded counts), saved like
    ``eagle-ms build-vocab`` does."""
    used = np.flatnonzero(state["t2d"])
    counts = np.zeros(TEACHER.vocab_size, np.int64)
    counts[used] = np.random.default_rng(5).integers(1, 100, used.size)
    path = str(tmp_path / name)
    save_vocab(path, vocab_from_counts(counts, n), {"format": "test"})
    return path


def test_narrowed_rows_are_the_originals_for_the_same_target_ids(tmp_path):
    wide_dir, wide = wide_draft(tmp_path)
    vocab_path = subset_vocab(tmp_path, wide, 10)
    summary = narrow_draft(wide_dir, vocab_path, str(tmp_path / "narrow"))
    assert summary["dtype"] == "float16" and summary["draft_vocab_size"] == [24, 10]
    cfg, narrow = load_draft_checkpoint(str(tmp_path / "narrow"), TEACHER)
    vocab = load_vocab(vocab_path)[0]
    assert cfg.draft_vocab_size == 10
    assert np.array_equal(narrow["d2t"], vocab.d2t) and np.array_equal(narrow["t2d"], vocab.t2d)
    # the reference: target id -> row of the wide draft, from its d2t (target = draft id + d2t[draft id])
    row_of = {int(i + wide["d2t"][i]): i for i in range(WIDE.draft_vocab_size)}
    for new_id in range(10):
        target = new_id + int(narrow["d2t"][new_id])
        assert np.array_equal(narrow["lm_head.weight"][new_id], wide["lm_head.weight"][row_of[target]])
    for key, value in wide.items():  # every other weight bit for bit (fp16 on disk both times)
        if key not in ("lm_head.weight", "d2t", "t2d"):
            assert np.array_equal(narrow[key], value), key


def test_the_narrowed_draft_cell_gives_the_kept_tokens_log_softmax(tmp_path):
    wide_dir, wide = wide_draft(tmp_path, dtype="float32")
    vocab_path = subset_vocab(tmp_path, wide, 7)
    narrow_draft(wide_dir, vocab_path, str(tmp_path / "narrow"))
    cfg, narrow = load_draft_checkpoint(str(tmp_path / "narrow"), TEACHER)
    cell = Eagle3Draft(cfg, 1, 16, 2)
    load_draft_state(cell, narrow, embed=np.zeros((TEACHER.vocab_size, TEACHER.hidden_size), np.float32))
    hidden = np.random.default_rng(0).standard_normal((1, 3, TEACHER.hidden_size)).astype(np.float32)
    got = cell.logprobs(Tensor(hidden)).asnumpy()[0]  # [3, 7]
    # float64 reference from the WIDE weights: RMSNorm, its logits for the kept target ids, log-softmax
    h = hidden[0].astype(np.float64)
    normed = h / np.sqrt(np.mean(h * h, -1, keepdims=True) + cfg.rms_norm_eps) * wide["norm.weight"]
    kept = np.arange(7) + narrow["d2t"]
    wide_rows = [int(np.flatnonzero(np.arange(24) + wide["d2t"] == t)[0]) for t in kept]
    logits = normed @ wide["lm_head.weight"][wide_rows].astype(np.float64).T
    want = logits - logits.max(-1, keepdims=True)
    want -= np.log(np.exp(want).sum(-1, keepdims=True))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


def test_a_vocabulary_the_draft_does_not_cover_is_refused_naming_the_ids(tmp_path):
    _, wide = wide_draft(tmp_path)
    outside = np.flatnonzero(~wide["t2d"])[:3]
    counts = np.zeros(TEACHER.vocab_size, np.int64)
    counts[outside] = 10
    counts[np.flatnonzero(wide["t2d"])[:5]] = 5
    vocab = vocab_from_counts(counts, 8)
    with pytest.raises(ValueError, match=re.escape(f"3 target ids the draft D cannot draft (first: {outside.tolist()})")):
        narrow_draft_state(WIDE, wide, vocab, "D")
    other = vocab_from_counts(np.ones(32, np.int64), 8)
    with pytest.raises(ValueError, match="for 64 target ids, the vocabulary for 32"):
        narrow_draft_state(WIDE, wide, other, "D")


def test_cli_writes_the_draft_and_refuses_bad_input_without_writing(tmp_path):
    wide_dir, wide = wide_draft(tmp_path)
    vocab_path = subset_vocab(tmp_path, wide, 12)
    out = tmp_path / "narrow"
    run = run_cli("narrow-draft", "--draft", wide_dir, "--vocab", vocab_path, "--out", str(out), "--dtype",
                  "float32")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["lm_head_params"] == [24 * 32, 12 * 32]
    assert json.load(open(out / "config.json"))["draft_vocab_size"] == 12
    # the output directory is not the input; a missing draft is named; nothing is written on failure
    same = run_cli("narrow-draft", "--draft", wide_dir, "--vocab", vocab_path, "--out", wide_dir)
    assert same.returncode == 2 and "is the draft being narrowed" in same.stderr
    missing = run_cli("narrow-draft", "--draft", str(tmp_path / "none"), "--vocab", vocab_path, "--out",
                      str(tmp_path / "x"))
    assert missing.returncode == 2 and "none" in missing.stderr and not (tmp_path / "x").exists()
    assert isinstance(CheckpointError("x"), ValueError)
