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


def random_weight(key, k: int, n: int, bits: int, codebook=Codebook.MUL1, bias=False) -> EXL3Weight:
  """Random words (every bitstream is a valid trellis: states are just its windows) and suh / svh
  of random sign and magnitude, as the quantizer leaves them. For kernel tests and benchmarks."""
  keys = jax.random.split(key, 6)
  suh = jax.random.rademacher(keys[0], (k,)) * jax.random.uniform(
    keys[1], (k,), minval=0.01, maxval=0.1
  )
  svh = jax.random.rademacher(keys[2], (n,)) * jax.random.uniform(
    keys[3], (n,), minval=0.5, maxval=2
  )
  u16 = jax.random.bits(keys[4], (k // TILE_DIM, n // TILE_DIM, TILE_DIM * bits), jnp.uint16)
  return EXL3Weight(
    trellis=jax.lax.bitcast_convert_type(u16, jnp.int16),
    suh=suh.astype(jnp.float16),
    svh=svh.astype(jnp.float16),
    bias=jax.random.normal(keys[5], (n,), jnp.float16) if bias else None,
    codebook=Codebook(codebook),
    in_features=k,
    out_features=n,
  )


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
