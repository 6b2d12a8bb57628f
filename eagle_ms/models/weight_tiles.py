"""The tile-major layout of the float16 weight copies the draft kernels read (eagle_ms/models/draft_kernels.cc
``matmul_rows``).

A matrix [in, out] (row-major) is stored as its column tiles of ``TILE`` columns, each tile's [in, TILE]
block contiguous, the tiles in column order, then the last ``out % TILE`` columns as [in, out % TILE]: the
same shape and values, another order. The kernel's inner loop walks one tile down all ``in`` rows, so in
this order it reads consecutive bytes instead of one cache line per row ``out`` columns apart.
"""
from __future__ import annotations

import numpy as np

TILE = 32  # draft_kernels.cc kTile


def pack_tiles(matrix: np.ndarray) -> np.ndarray:
    """[in, out] row-major -> the same shape in tile-major order (module doc)."""
    rows, cols = matrix.shape
    full = cols // TILE * TILE
    tiles = matrix[:, :full].reshape(rows, full // TILE, TILE).transpose(1, 0, 2)  # [out/TILE, in, TILE]
    return np.concatenate([tiles.reshape(-1), matrix[:, full:].reshape(-1)]).reshape(rows, cols)


def unpack_tiles(packed: np.ndarray) -> np.ndarray:
    """The inverse of ``pack_tiles``."""
    rows, cols = packed.shape
    full = cols // TILE * TILE
    flat = packed.reshape(-1)
    tiles = flat[:rows * full].reshape(full // TILE, rows, TILE).transpose(1, 0, 2).reshape(rows, full)
    return np.concatenate([tiles, flat[rows * full:].reshape(rows, cols - full)], axis=1)
