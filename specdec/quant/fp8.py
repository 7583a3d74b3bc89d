"""FP8 (E4M3) weights with a per-tensor or per-output-channel FP32 scale.

Shape letters: K = in features, N = out features. The codes stay in the checkpoint layout, e4m3
[N, K] (ModelOpt and compressed-tensors store the same bytes), K-contiguous like the NVFP4 weight.

The scale is kept per output column (`scale_N`): a per-tensor checkpoint broadcasts its scalar, a
per-channel one (ModelOpt FP8_PER_CHANNEL_PER_TOKEN, compressed-tensors strategy "channel") stores
[N], and a fused projection keeps each shard's own scale. Both tools dequantize as
`f32(code) * scale`; the scale is not inverted.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec.quant.errors import QuantFormatError
from specdec.quant.nvfp4 import exact_div

E4M3_MAX = 448.0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FP8Weight:
  """A (K, N) weight; W[k, n] = f32(codes[n, k]) * scale[n]."""

  codes_NK: jax.Array  # float8_e4m3fn [N, K]
  scale_N: jax.Array  # float32 [N]

  @property
  def shape(self) -> tuple[int, int]:
    return (self.codes_NK.shape[-1], self.codes_NK.shape[-2])

  def dequantize(self, dtype=jnp.bfloat16) -> jax.Array:
    return _dequantize(self, jnp.dtype(dtype))

  def columns(self, start: int, stop: int) -> "FP8Weight":
    """Output columns [start, stop): one shard of a fused projection."""
    return FP8Weight(self.codes_NK[..., start:stop, :], self.scale_N[..., start:stop])


@functools.partial(jax.jit, static_argnames="dtype")
def _dequantize(w: FP8Weight, dtype) -> jax.Array:
  # An e4m3 code (4 significant bits) times a scale from bf16/f16 is exact in f32, so the one
  # rounding to `dtype` equals the tools' arithmetic in that 16-bit dtype (f32 scales: identical).
  w_NK = jnp.asarray(w.codes_NK).astype(jnp.float32) * jnp.asarray(w.scale_N)[..., None]
  return jnp.swapaxes(w_NK, -1, -2).astype(dtype)


def random_weight(key, k: int, n: int, copies: int = 1) -> FP8Weight:
  """Uniformly random non-NaN codes (every exponent, subnormals included), column scales in
  [2^-10, 2^-8] so outputs of unit-variance x stay near 1. For kernel tests and benchmarks."""
  k1, k2 = jax.random.split(key)
  lead = (copies,) if copies > 1 else ()
  bits = jax.random.bits(k1, (*lead, n, k), jnp.uint8)
  bits = jnp.where((bits & 0x7F) == 0x7F, bits ^ 1, bits)  # 0x7F / 0xFF are E4M3 NaN
  scale = jnp.exp2(jax.random.uniform(k2, (*lead, n), minval=-10, maxval=-8))
  return FP8Weight(jax.lax.bitcast_convert_type(bits, jnp.float8_e4m3fn), scale)


def concat_columns(shards: list[FP8Weight]) -> FP8Weight:
  """Fuses projections along `out`, each shard keeping its own scale."""
  if len({w.shape[0] for w in shards}) != 1:
    raise QuantFormatError(f"cannot fuse FP8 shards of shapes {[w.shape for w in shards]}")
  return FP8Weight(
    jnp.concatenate([jnp.asarray(w.codes_NK) for w in shards], axis=-2),
    jnp.concatenate([jnp.asarray(w.scale_N) for w in shards], axis=-1),
  )


@functools.partial(jax.jit, static_argnames="per_channel")
def quantize(w_KN: jax.Array, *, per_channel: bool = False) -> FP8Weight:
  """scale = amax / 448 (per tensor or per output row), codes = e4m3(clip(w / scale, +-448)).

  In FP32: compressed-tensors' and ModelOpt's arithmetic for FP32 weights. A zero amax gives the
  FP32 machine epsilon as scale (compressed-tensors' rule), so nothing divides by zero; the clip
  matters because JAX's e4m3 cast does not saturate.
  """
  w_NK = jnp.swapaxes(jnp.asarray(w_KN, jnp.float32), -1, -2)
  amax = jnp.max(jnp.abs(w_NK), axis=-1 if per_channel else (-2, -1), keepdims=True)
  scale = exact_div(amax, E4M3_MAX)
  scale = jnp.where(scale == 0, np.finfo(np.float32).eps, scale)
  codes_NK = jnp.clip(exact_div(w_NK, scale), -E4M3_MAX, E4M3_MAX).astype(jnp.float8_e4m3fn)
  return FP8Weight(codes_NK, jnp.broadcast_to(scale[..., 0], w_NK.shape[:-1]))
