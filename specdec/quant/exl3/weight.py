"""`EXL3Weight`: one EXL3-quantized linear layer as a JAX pytree.

W (in, out) = diag(suh) . H . W_hat . H . diag(svh), where W_hat holds the codebook values of the
trellis states and H is the blockwise orthonormal 128-point Hadamard (see `hadamard.py`).
Checkpoint tensors are kept as stored (padded to multiples of 128); `shape` is the logical one.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from specdec.quant.exl3.bitstream import unpack_states
from specdec.quant.exl3.codebook import Codebook, decode_states
from specdec.quant.exl3.hadamard import had_cols, had_rows
from specdec.quant.exl3.layout import TILE_DIM, tiles_to_matrix


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EXL3Weight:
  """Arrays exactly as an exllamav3 checkpoint stores them (validated in `checkpoint.py`).

  trellis: [in_p/16, out_p/16, 16K] int16; suh: [in_p] f16; svh: [out_p] f16; bias: [out_p] | None.
  """

  trellis: jax.Array
  suh: jax.Array
  svh: jax.Array
  bias: jax.Array | None
  codebook: Codebook = dataclasses.field(metadata=dict(static=True))
  in_features: int = dataclasses.field(metadata=dict(static=True))
  out_features: int = dataclasses.field(metadata=dict(static=True))

  @property
  def bits(self) -> int:
    """K, bits per weight: read from the trellis' last dimension, as exllamav3 does."""
    return self.trellis.shape[-1] // 16

  @property
  def shape(self) -> tuple[int, int]:
    return (self.in_features, self.out_features)

  @property
  def padded_shape(self) -> tuple[int, int]:
    return (self.trellis.shape[0] * TILE_DIM, self.trellis.shape[1] * TILE_DIM)

  def states(self) -> jax.Array:
    """The trellis states [in_p/16, out_p/16, 256] int32, in trellis order."""
    return unpack_states(self.trellis, self.bits)

  def inner(self) -> jax.Array:
    """W_hat (in_p, out_p) float32: the decoded trellis before the rotations and scales."""
    return _inner(self.trellis, self.codebook)

  def dequantize(self, dtype=jnp.bfloat16) -> jax.Array:
    w_IO = _dense(self.trellis, self.suh, self.svh, self.codebook)
    return w_IO[: self.in_features, : self.out_features].astype(dtype)

  def matmul(self, x_MK: jax.Array) -> jax.Array:
    if jax.default_backend() == "gpu" and x_MK.dtype == jnp.bfloat16:
      # Imported here: CPU runs never need Pallas. M > 16 and unsupported shapes fall back to
      # dense_matmul inside.
      from kernels_pallas.exl3_gemv import exl3_matmul

      y_MN = exl3_matmul(x_MK.reshape(-1, x_MK.shape[-1]), self)
      return y_MN.reshape(*x_MK.shape[:-1], y_MN.shape[-1])
    return self.dense_matmul(x_MK)

  def dense_matmul(self, x_MK: jax.Array) -> jax.Array:
    """Reconstruct W in x's dtype and let XLA multiply (also the kernel's prefill and fallback)."""
    y_MN = jnp.einsum("...i,io->...o", x_MK, self.dequantize(x_MK.dtype))
    if self.bias is not None:
      y_MN = y_MN + self.bias[: self.out_features].astype(y_MN.dtype)
    return y_MN


@functools.partial(jax.jit, static_argnames=("codebook",))
def _inner(trellis_KNW: jax.Array, codebook: Codebook) -> jax.Array:
  states_KNP = unpack_states(trellis_KNW, trellis_KNW.shape[-1] // 16)
  return tiles_to_matrix(decode_states(states_KNP, codebook).astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("codebook",))
def _dense(trellis_KNW, suh_I, svh_O, codebook: Codebook) -> jax.Array:
  """diag(suh) . H . W_hat . H . diag(svh), (in_p, out_p) float32."""
  rotated_IO = had_cols(
    suh_I.astype(jnp.float32)[:, None] * had_rows(_inner(trellis_KNW, codebook))
  )
  return rotated_IO * svh_O.astype(jnp.float32)[None, :]
