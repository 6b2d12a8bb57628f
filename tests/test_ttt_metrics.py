"""Held-out acceptance counts of the draft trainer (eagle_ms/train/ttt_metrics.py) against a row-by-row
reference written here, and the answer-offset bands by hand."""
import numpy as np
import pytest

from eagle_ms.train.ttt_metrics import answer_offsets, band_counts, batch_counts, summarize_bands


def test_answer_offsets_worked_example():
    mask = np.array([[0, 1, 1, 1, 0], [1, 1, 0, 1, 1]], np.float32)
    np.testing.assert_array_equal(answer_offsets(mask), [[-1, 0, 1, 2, -1], [0, 1, -1, 0, 1]])


def _reference(tops, argmax, mask, width, bands):
    """Per band k: valid[i], correct[i], chain_num[i], chain_den[i] by walking every row's chain."""
    steps, b, t = tops.shape
    out = np.zeros((bands, 4, steps))
    for r in range(b):
        run = 0
        for j in range(t):
            run = run + 1 if mask[r, j] > 0 else 0
            if run == 0:
                continue  # the root (token j+1) is not an answer token
            k = min((run - 1) // width, bands - 1)
            alive = True
            for i in range(steps):
                pos = j + 1 + i
                valid = pos < t and mask[r, pos] > 0
                hit = pos < t and tops[i, r, j] == argmax[r, pos]
                if valid:
                    out[k, 0, i] += 1
                    out[k, 1, i] += hit
                    out[k, 3, i] += alive
                alive = alive and hit
                if valid:
                    out[k, 2, i] += alive
    return out


@pytest.mark.parametrize("width, bands", [(3, 3), (5, 2), (100, 1)])
def test_band_counts_equal_the_row_by_row_reference(width, bands):
    rng = np.random.default_rng(width)
    steps, b, t = 4, 3, 17
    argmax = rng.integers(0, 3, (b, t))
    tops = np.where(rng.random((steps, b, t)) < 0.7, np.stack([np.roll(argmax, -(i + 1), 1) for i in range(steps)]),
                    rng.integers(0, 3, (steps, b, t)))  # mostly right, so chains of several steps occur
    mask = np.zeros((b, t), np.float32)
    mask[0, 2:15], mask[1, 1:6], mask[1, 8:16], mask[2, :] = 1, 1, 1, 1  # two answers in row 1
    got = band_counts(tops, argmax, mask, width, bands)
    want = _reference(tops, argmax, mask, width, bands)
    np.testing.assert_array_equal(got, want)
    # every row with an answer root is in exactly one band: the bands add up to the rows' own counts
    rows = answer_offsets(mask) >= 0
    zeros = np.zeros(steps)
    np.testing.assert_array_equal(got.sum(0), batch_counts(tops, argmax, mask, zeros, zeros, rows=rows)[:4])
    assert (want[:, 2, 2] > 0).any()  # chains of three accepted steps occur


def test_summarize_bands_by_hand():
    counts = np.zeros((3, 4, 2))
    counts[0] = [[4, 2], [3, 1], [3, 1], [4, 3]]  # valid, correct, chain_num, chain_den
    counts[2] = [[2, 2], [2, 2], [2, 2], [2, 2]]  # band 1 is empty: left out
    out = summarize_bands(counts, 256)
    assert [(b["from"], b["to"], b["positions"]) for b in out] == [(0, 256, 4), (512, None, 2)]
    assert out[0]["acc"] == [0.75, 0.5] and out[0]["cond_acc"] == [0.75, pytest.approx(1 / 3, abs=1e-6)]
    assert out[0]["accept_len"] == pytest.approx(0.75 + 0.75 / 3)
    assert out[1]["accept_len"] == 2.0
