"""Where each trellis position lands in the (in, out) weight matrix.

Tile [tk, tn] of `.trellis [in/16, out/16, 16K]` covers rows 16tk.. (input dim) and columns 16tn..
(output dim). Inside a tile, position t = 8 * lane + e follows the m16n8k16 tensor-core B-fragment
order, so that a GPU lane decodes exactly the 8 values its two B fragments need.
Source of truth: exllamav3 `exl3_lib/quantize.py:tensor_core_perm` and `quant/reconstruct.cu`.
"""

import jax
import numpy as np

TILE_DIM = 16


def _tensor_core_perm() -> np.ndarray:
  """position t -> row-major index r * 16 + c inside the tile."""
  perm = np.empty(256, np.int32)
  offsets_rc = [(0, 0), (1, 0), (8, 0), (9, 0), (0, 8), (1, 8), (8, 8), (9, 8)]
  for lane in range(32):
    r0, c0 = 2 * (lane % 4), lane // 4
    for e, (dr, dc) in enumerate(offsets_rc):
      perm[8 * lane + e] = (r0 + dr) * TILE_DIM + (c0 + dc)
  return perm


TENSOR_CORE_PERM = _tensor_core_perm()
TENSOR_CORE_PERM_INV = np.argsort(TENSOR_CORE_PERM).astype(np.int32)


def tiles_to_matrix(tiles_KNP: jax.Array) -> jax.Array:
  """Values in trellis order [in/16, out/16, 256] -> the (in, out) matrix."""
  tk, tn, _ = tiles_KNP.shape
  rowmajor_KNrc = tiles_KNP[..., TENSOR_CORE_PERM_INV].reshape(tk, tn, TILE_DIM, TILE_DIM)
  return rowmajor_KNrc.transpose(0, 2, 1, 3).reshape(tk * TILE_DIM, tn * TILE_DIM)


def matrix_to_tiles(w_IO: jax.Array) -> jax.Array:
  """The (in, out) matrix -> values in trellis order [in/16, out/16, 256]."""
  n_in, n_out = w_IO.shape
  tk, tn = n_in // TILE_DIM, n_out // TILE_DIM
  rowmajor_KNP = w_IO.reshape(tk, TILE_DIM, tn, TILE_DIM).transpose(0, 2, 1, 3).reshape(tk, tn, -1)
  return rowmajor_KNP[..., TENSOR_CORE_PERM]


def strip_to_tiles(rows_RO: jax.Array) -> jax.Array:
  """One strip of 16 input rows (16, out) -> its out/16 tiles in trellis order [out/16, 256]."""
  return matrix_to_tiles(rows_RO)[0]


def tiles_to_strip(tiles_NP: jax.Array) -> jax.Array:
  return tiles_to_matrix(tiles_NP[None])


def pad_to(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple
