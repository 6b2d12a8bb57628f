"""Batch assembly for the draft trainer: padding to buckets and the predicted-token loss mask."""
import numpy as np

from eagle_ms.train.shards import SampleFeatures
from eagle_ms.train.ttt_data import make_batch


def _sample(mask):
    n = len(mask)
    return SampleFeatures(np.arange(1, n + 1, dtype=np.int32), np.asarray(mask, bool),
                          np.ones((n, 6), np.float16), np.ones((n, 2), np.float16))


def test_batch_mask_marks_positions_whose_next_token_is_an_assistant_token():
    batch = make_batch([_sample([0, 0, 1, 1, 0]), _sample([0, 1, 1])], buckets=(4, 8))
    assert batch.input_ids.shape == (2, 8)  # padded to the bucket of the longest sample
    np.testing.assert_array_equal(batch.loss_mask, [[0, 1, 1, 0, 0, 0, 0, 0],
                                                    [1, 1, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(batch.input_ids[1], [1, 2, 3, 0, 0, 0, 0, 0])
    assert batch.loss_tokens == 4
