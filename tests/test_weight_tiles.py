"""The tile-major order of the draft kernels' float16 weight copies (eagle_ms/models/weight_tiles.py), against
the order written out element by element; the kernels' results with it are checked bit for bit against the
row-major float32 weights in tests/test_eagle3_model.py (``test_float16_weight_copies_give_the_float32_kernels_bits``)."""
import numpy as np
import pytest

from eagle_ms.models.weight_tiles import TILE, pack_tiles, unpack_tiles


def tile_major_by_hand(m):
    rows, cols = m.shape
    full = cols // TILE * TILE
    order = [m[i, t + c] for t in range(0, full, TILE) for i in range(rows) for c in range(TILE)]
    order += [m[i, c] for i in range(rows) for c in range(full, cols)]
    return np.array(order, m.dtype).reshape(rows, cols)


@pytest.mark.parametrize("shape", [(3, 70), (5, 64), (4, 7), (1, 32), (6, 33)])
def test_pack_is_the_tile_major_order_and_unpack_inverts_it(shape):
    m = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float16)
    packed = pack_tiles(m)
    assert packed.shape == m.shape and packed.dtype == m.dtype
    np.testing.assert_array_equal(packed, tile_major_by_hand(m))
    np.testing.assert_array_equal(unpack_tiles(packed), m)
