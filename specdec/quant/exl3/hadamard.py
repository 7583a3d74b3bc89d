"""The blockwise 128-point Hadamard rotation EXL3 applies on both sides of the weight.

H128 is the Sylvester (natural-order) matrix H[i, j] = (-1)^popcount(i & j) scaled by 1/sqrt(128):
symmetric and orthogonal, so it is its own inverse. exllamav3 builds it by Sylvester doubling
from `hadamard_1.txt` ("+"), since no 128-point file ships (`util/hadamard.py`); its warp-shuffle
kernel is the same natural-order butterfly.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

HAD_DIM = 128


@functools.cache
def hadamard_matrix(n: int = HAD_DIM) -> np.ndarray:
  """Orthonormal Sylvester Hadamard matrix [n, n] float32 (n a power of two)."""
  idx = np.arange(n)
  parity = (np.bitwise_count(idx[:, None] & idx[None, :]) & 1).astype(np.int32)
  return ((1 - 2 * parity) / np.sqrt(n)).astype(np.float32)


def had_rows(w_IO: jax.Array) -> jax.Array:
  """blockdiag(H128) @ w: rotate every 128-row block of the input dim."""
  n_in, n_out = w_IO.shape
  blocks_BhO = w_IO.reshape(n_in // HAD_DIM, HAD_DIM, n_out)
  h = jnp.asarray(hadamard_matrix(), w_IO.dtype)
  return jnp.einsum("ij,bjo->bio", h, blocks_BhO, precision="highest").reshape(n_in, n_out)


def had_cols(w_IO: jax.Array) -> jax.Array:
  """w @ blockdiag(H128): rotate every 128-column block of the last dim (works on [..., out])."""
  *lead, n_out = w_IO.shape
  blocks_LBh = w_IO.reshape(*lead, n_out // HAD_DIM, HAD_DIM)
  h = jnp.asarray(hadamard_matrix(), w_IO.dtype)
  return jnp.einsum("...bj,jo->...bo", blocks_LBh, h, precision="highest").reshape(w_IO.shape)


def had_activations(x_MN: jax.Array) -> jax.Array:
  """had_cols for activations (a few rows): each output is a multiply and a row sum over its
  128-block, so XLA can fuse the rotation with the scaling, casts and slices beside it into one
  kernel, where the dot of `had_cols` is a launch of its own around every EXL3 GEMV."""
  *lead, n = x_MN.shape
  blocks = x_MN.reshape(*lead, n // HAD_DIM, 1, HAD_DIM)
  h = jnp.asarray(hadamard_matrix(), x_MN.dtype)  # symmetric: row k of H is its column k
  return jnp.sum(blocks * h, axis=-1).reshape(x_MN.shape)
