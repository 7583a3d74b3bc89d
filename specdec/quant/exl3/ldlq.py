"""LDLQ: trellis-quantize 16-row strips with error feedback through a calibration Hessian.

With H = L D L^T (L unit lower block-triangular in 16x16 blocks), the proxy loss tr(E^T H E) of the
error E = W - Q splits into one term per 16-row strip b: the strip's own quantization error after
adding the feedback sum_{r > b} L[r, b]^T E[r]. So strips are quantized from the last to the first,
each target corrected by the errors already made below it (as exllamav3's `ldlq` does).
"""

import functools

import jax
import jax.numpy as jnp

from specdec.quant.exl3.codebook import Codebook
from specdec.quant.exl3.layout import TILE_DIM, strip_to_tiles, tiles_to_strip
from specdec.quant.exl3.viterbi import viterbi_tiles


def block_ldl(h_II: jax.Array, block: int = TILE_DIM) -> jax.Array:
  """Unit lower block-triangular L with h = L D L^T (D block-diagonal); NaN if h is not PD."""
  n = h_II.shape[0]
  m = n // block
  chol_II = jnp.linalg.cholesky(h_II)
  idx = jnp.arange(m)
  diag_Mbb = chol_II.reshape(m, block, m, block)[idx, :, idx, :]
  # L = C . blockdiag(C_bb)^-1 turns the diagonal blocks into identities; D_b = C_bb C_bb^T.
  l_IMb = jnp.einsum("imc,mcb->imb", chol_II.reshape(n, m, block), jnp.linalg.inv(diag_Mbb))
  return l_IMb.reshape(n, n)


@functools.partial(jax.jit, static_argnames=("bits", "codebook", "chunk"))
def ldlq(
  w_IO: jax.Array, l_II: jax.Array, bits: int, codebook: Codebook, chunk: int | None = None
) -> tuple[jax.Array, jax.Array]:
  """w (in, out) already regularized and scaled to the codebook; l from `block_ldl`.

  Returns (states [in/16, out/16, 256] int32, quantized w (in, out) float32).
  """
  n_in, n_out = w_IO.shape

  def strip(err_IO, b):
    # err is zero on strips not yet quantized (b and above), so the full column block of L, diagonal
    # block included, gives exactly the feedback from the strips below.
    l_I16 = jax.lax.dynamic_slice_in_dim(l_II, b * TILE_DIM, TILE_DIM, axis=1)
    w_16O = jax.lax.dynamic_slice_in_dim(w_IO, b * TILE_DIM, TILE_DIM, axis=0)
    target_16O = w_16O + jnp.einsum("ir,io->ro", l_I16, err_IO, precision="highest")
    states_NP, values_NP = viterbi_tiles(strip_to_tiles(target_16O), bits, codebook, chunk)
    q_16O = tiles_to_strip(values_NP)
    err_IO = jax.lax.dynamic_update_slice_in_dim(err_IO, w_16O - q_16O, b * TILE_DIM, axis=0)
    return err_IO, (states_NP, q_16O)

  err_IO = jnp.zeros((n_in, n_out), jnp.float32)
  _, (states_BNP, q_B16O) = jax.lax.scan(strip, err_IO, jnp.arange(n_in // TILE_DIM), reverse=True)
  return states_BNP, q_B16O.reshape(n_in, n_out)
