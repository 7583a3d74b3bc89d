"""NVFP4 weights: E2M1 codes in blocks of 16 along `in`, an E4M3 scale per block, a global scale.

Shape letters: K = in features, N = out features, G = K/16 scale groups, P = K/2 packed bytes.

The data keeps the checkpoint's layout, `packed_NP` uint8 [N, K/2] (element 2j in the low nibble)
and `scales_NG` e4m3 [N, K/16]: ModelOpt and compressed-tensors store exactly these bytes, and it is
the K-contiguous "weight as the A operand" layout a swap-AB GEMV/GEMM reads. On a CPU loading is
zero-copy. On a GPU (`for_device`, applied by `specdec.load` and `quantize_model`) the codes are
kept in the kernel's bit order (`bit_order="kernel"`, see `PAIR_SHIFTS`): the same bytes with the
bits of each 32-bit word of 8 codes permuted once, so that kernels_pallas/nvfp4_gemv decodes a word
in 11 integer operations instead of 15 (the gain: docs/benchmarks.md). Every operation here reads
either order; checkpoints are always written in the checkpoint's.

The global scale keeps the orientation the checkpoint stored (`global_divides`): ModelOpt's
`weight_scale_2` multiplies, compressed-tensors' `weight_global_scale` divides. Flipping it costs
an FP32 rounding, and both tools dequantize as `code * fl(block_scale (*|/) global)`; keeping the
stored value makes our reference dequant bit-identical to theirs. A kernel applies it once per
output column.

The global scale is one value per output column (`global_scale_N`) so that a fused projection
(q/k/v, gate/up) keeps each shard's own: the shards of an HF checkpoint are quantized separately
and their global scales differ in general, so one scale for the fused weight would be wrong.
"""

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from specdec.quant.errors import QuantFormatError

GROUP = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_MIN_SUBNORMAL = 2.0**-9
# Code c: bit 3 is the sign, bits 2..0 index the magnitudes. Code 8 is -0 (ModelOpt decodes +0).
E2M1_VALUES = np.array(
  [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32
)

Convention = Literal["modelopt", "compressed-tensors"]
BitOrder = Literal["checkpoint", "kernel"]

# Per decode pair p (codes p and p + 4 of a 32-bit word, the low and high bf16 of one register):
# the left shifts (negative: right) that move its sign bits to bits 15 / 31 and its magnitude bits
# to [8:6] / [24:22], which makes E2M1(code) * 2^-126 in bf16 (nvfp4_gemv's decode). In the
# checkpoint's order (code j in bits 4j..4j+3) the two shifts differ for every pair: 15 integer ops
# per word. The kernel's order puts each bit where one shared shift or none serves: pairs 1 and 3
# are one mask (after one shift), pairs 0 and 2 two shifts, a mask and a merge: 11 ops. (An
# exhaustive search over these shift pairs finds no placement cheaper than 11.)
PAIR_SHIFTS = {
  "checkpoint": ((12, 6), (8, 2), (4, -2), (0, -6)),
  "kernel": ((4, -6), (0, 0), (5, 3), (6, 6)),
}


def exact_div(a: jax.Array, b: jax.Array) -> jax.Array:
  """a / b with one IEEE rounding, as torch computes it.

  Under jit, XLA's algebraic simplifier rewrites `x / broadcast(y)` and `x / constant` into
  `x * (1/y)`, which rounds twice (a quarter of all f32 quotients change by an ulp). The divisor is
  materialized behind an optimization barrier so that the rewrite cannot see the broadcast.
  """
  a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
  return a / jax.lax.optimization_barrier(b)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NVFP4Weight:
  """A (K, N) weight; W[k, n] = E2M1(code[n, k]) * fl(scales[n, k // 16] (*|/) global_scale[n])."""

  packed_NP: jax.Array  # uint8 [N, K/2]; low nibble = even k
  scales_NG: jax.Array  # float8_e4m3fn [N, K/16]
  global_scale_N: jax.Array  # float32 [N]
  global_divides: bool = dataclasses.field(default=False, metadata=dict(static=True))
  bit_order: BitOrder = dataclasses.field(default="checkpoint", metadata=dict(static=True))

  @property
  def shape(self) -> tuple[int, int]:
    return (self.packed_NP.shape[-1] * 2, self.packed_NP.shape[-2])

  def block_scales(self) -> jax.Array:
    """The effective f32 scale of each block, rounded as ModelOpt / compressed-tensors round it."""
    scales_NG = jnp.asarray(self.scales_NG).astype(jnp.float32)
    g_N1 = jnp.asarray(self.global_scale_N, jnp.float32)[..., None]
    return exact_div(scales_NG, g_N1) if self.global_divides else scales_NG * g_N1

  def dequantize(self, dtype=jnp.bfloat16) -> jax.Array:
    return _dequantize(self, jnp.dtype(dtype))

  def columns(self, start: int, stop: int) -> "NVFP4Weight":
    """Output columns [start, stop): one shard of a fused projection."""
    return dataclasses.replace(
      self,
      packed_NP=self.packed_NP[..., start:stop, :],
      scales_NG=self.scales_NG[..., start:stop, :],
      global_scale_N=self.global_scale_N[..., start:stop],
    )

  def in_order(self, order: BitOrder) -> "NVFP4Weight":
    """The same weight with its codes in `order` ("checkpoint" or "kernel")."""
    if order == self.bit_order:
      return self
    packed_NP = reorder_bits(self.packed_NP, self.bit_order, order)
    return dataclasses.replace(self, packed_NP=packed_NP, bit_order=order)


def random_weight(key, k: int, n: int, copies: int = 1) -> NVFP4Weight:
  """Random codes, E4M3 block scales spread over [2^-6, 2^6], global scale per column (`copies`
  > 1: that many weights stacked on a leading axis). For kernel tests and benchmarks."""
  k1, k2, k3 = jax.random.split(key, 3)
  lead = (copies,) if copies > 1 else ()
  packed = jax.random.bits(k1, (*lead, n, k // 2), jnp.uint8)
  scales = jnp.exp2(jax.random.uniform(k2, (*lead, n, k // GROUP), minval=-6, maxval=6))
  g = jax.random.uniform(k3, (*lead, n), minval=0.5, maxval=2.0)
  return NVFP4Weight(packed, scales.astype(jnp.float8_e4m3fn), g)


def device_order() -> BitOrder:
  """The bit order NVFP4 codes are kept in on the default backend: the kernel's on a GPU."""
  return "kernel" if jax.default_backend() == "gpu" else "checkpoint"


def _is_nvfp4(x) -> bool:
  return isinstance(x, NVFP4Weight)


def for_device(tree):
  """`tree` with every NVFP4Weight in `device_order()` (a model's params after load or quantize)."""
  order = device_order()
  return jax.tree.map(lambda x: x.in_order(order) if _is_nvfp4(x) else x, tree, is_leaf=_is_nvfp4)


@functools.partial(jax.jit, static_argnames="dtype")
def _dequantize(w: NVFP4Weight, dtype) -> jax.Array:
  codes_NK = unpack_codes(w.packed_NP, w.bit_order)
  vals_NGx = jnp.asarray(E2M1_VALUES)[codes_NK].reshape(*codes_NK.shape[:-1], -1, GROUP)
  w_NK = (vals_NGx * w.block_scales()[..., None]).reshape(codes_NK.shape)
  return jnp.swapaxes(w_NK, -1, -2).astype(dtype)


def concat_columns(shards: list[NVFP4Weight]) -> NVFP4Weight:
  """Fuses projections along `out` (q/k/v, gate/up), each shard keeping its own global scale."""
  if len({(w.global_divides, w.bit_order, w.shape[0]) for w in shards}) != 1:
    raise QuantFormatError(
      f"cannot fuse NVFP4 shards of shapes {[w.shape for w in shards]}, global orientations "
      f"{[w.global_divides for w in shards]} and bit orders {[w.bit_order for w in shards]}"
    )
  cat = lambda xs, axis: jnp.concatenate([jnp.asarray(x) for x in xs], axis=axis)
  return NVFP4Weight(
    cat([w.packed_NP for w in shards], -2),
    cat([w.scales_NG for w in shards], -2),
    cat([w.global_scale_N for w in shards], -1),
    shards[0].global_divides,
    shards[0].bit_order,
  )


@functools.cache
def _bit_sources(order: BitOrder) -> tuple[int, ...]:
  """src[d]: the checkpoint-order bit (4 j + i: bit i of code j) that `order` keeps at bit d."""
  src = [-1] * 32
  for p, (sign, mag) in enumerate(PAIR_SHIFTS[order]):
    for lane in range(2):
      code, base = p + 4 * lane, 16 * lane
      src[base + 15 - sign] = 4 * code + 3
      for i in range(3):
        src[base + 6 + i - mag] = 4 * code + i
  assert sorted(src) == list(range(32)), order
  return tuple(src)


def _move_bits(w: jax.Array, dst_of_src: dict[int, int]) -> jax.Array:
  """Bit s of each uint32 to bit dst_of_src[s], one mask and shift per distinct distance."""
  by_shift: dict[int, int] = {}
  for s, d in dst_of_src.items():
    by_shift[d - s] = by_shift.get(d - s, 0) | (1 << s)
  out = jnp.zeros_like(w)
  for shift, mask in sorted(by_shift.items()):
    moved = w & jnp.uint32(mask)
    out = out | (moved << shift if shift >= 0 else moved >> -shift)
  return out


def reorder_bits(packed_NP: jax.Array, src: BitOrder, dst: BitOrder) -> jax.Array:
  """uint8 [..., K/2] codes in bit order `src` -> the same codes in `dst` (K a multiple of 8)."""
  packed_NP = jnp.asarray(packed_NP, jnp.uint8)
  if src == dst:
    return packed_NP
  if packed_NP.shape[-1] % 4:
    raise QuantFormatError(f"NVFP4 bit reorder needs K divisible by 8, got K/2 = {packed_NP.shape}")
  w = jax.lax.bitcast_convert_type(packed_NP.reshape(*packed_NP.shape[:-1], -1, 4), jnp.uint32)
  ckpt_at = {d: s for d, s in enumerate(_bit_sources(src))}  # src bit d holds checkpoint bit s
  dst_of_ckpt = {s: d for d, s in enumerate(_bit_sources(dst))}
  w = _move_bits(w, {d: dst_of_ckpt[s] for d, s in ckpt_at.items()})
  return jax.lax.bitcast_convert_type(w, jnp.uint8).reshape(packed_NP.shape)


def unpack_codes(packed_NP: jax.Array, order: BitOrder = "checkpoint") -> jax.Array:
  """uint8 [..., K/2] -> uint8 codes [..., K]; in the checkpoint's order the low nibble is the
  even element."""
  packed_NP = reorder_bits(packed_NP, order, "checkpoint")
  lo, hi = packed_NP & 0xF, packed_NP >> 4
  return jnp.stack([lo, hi], axis=-1).reshape(*packed_NP.shape[:-1], -1)


def pack_codes(codes_NK: jax.Array) -> jax.Array:
  pairs = jnp.asarray(codes_NK, jnp.uint8).reshape(*codes_NK.shape[:-1], -1, 2)
  return pairs[..., 0] | (pairs[..., 1] << 4)


def e2m1_codes(y: jax.Array) -> jax.Array:
  """f32 -> E2M1 codes: round to nearest, ties to even, saturating at +-6.

  Each midpoint between grid neighbours is compared with `>=` where the upper neighbour has the even
  code (0.75 -> 1, 1.75 -> 2, 3.5 -> 4) and with `>` where the lower one has (0.25 -> 0, 1.25 -> 1,
  2.5 -> 2, 5 -> 4). The sign bit is `y < 0`: a small negative value becomes code 8 (-0) but -0.0
  itself becomes code 0, as in both compressed-tensors and ModelOpt (JAX's float4 cast keeps -0).
  """
  a = jnp.abs(y)
  mag = (
    (a > 0.25).astype(jnp.uint8)
    + (a >= 0.75)
    + (a > 1.25)
    + (a >= 1.75)
    + (a > 2.5)
    + (a >= 3.5)
    + (a > 5.0)
  )
  return mag.astype(jnp.uint8) | ((y < 0).astype(jnp.uint8) << 3)


@functools.partial(jax.jit, static_argnames="convention")
def quantize(
  w_KN: jax.Array, *, convention: Convention = "modelopt", global_scale=None
) -> NVFP4Weight:
  """Quantizes a dense (K, N) weight to NVFP4, reproducing the named tool's arithmetic in FP32.

  `convention` picks the global scale's orientation and the tools' operation order:
    modelopt:            g = amax / 2688,        scale = e4m3(blockamax / fl(6 g)),
                         code = rne(w / fl(scale * g))
    compressed-tensors:  g = fl(1 / amax) 2688,  scale = e4m3(g * fl(blockamax / 6)),
                         code = rne(w / fl(scale / g))
  `global_scale` (in that orientation) overrides g, e.g. to give fused shards one common scale, as
  ModelOpt's exporter does.

  Guards, each the named tool's own: an all-zero (or non-finite-scaled) tensor gets g = 1. ModelOpt
  gives an all-zero block the scale 1.0 and clamps a tiny block's scale up to e4m3's smallest
  subnormal 2^-9; compressed-tensors replaces any scale that rounded to 0 by 0.125, which zeroes
  blocks more than ~2e-6 below the tensor's maximum. The scale is clamped to 448 before the cast
  because JAX's e4m3 cast does not saturate (449 -> nan).
  """
  w_NK = jnp.swapaxes(jnp.asarray(w_KN, jnp.float32), -1, -2)
  n, k = w_NK.shape[-2:]
  if k % GROUP:
    raise QuantFormatError(
      f"NVFP4 needs in_features divisible by {GROUP}, got (in, out) shape {w_KN.shape}"
    )
  if convention not in ("modelopt", "compressed-tensors"):
    raise QuantFormatError(f"unknown NVFP4 convention {convention!r}")
  divides = convention == "compressed-tensors"

  w_NGx = w_NK.reshape(*w_NK.shape[:-1], k // GROUP, GROUP)
  blockmax_NG = jnp.max(jnp.abs(w_NGx), axis=-1)
  if global_scale is None:
    amax = jnp.max(blockmax_NG, axis=(-2, -1), keepdims=True)
    # compressed-tensors writes `2688 / amax`, which torch evaluates as `reciprocal(amax) * 2688`.
    if divides:
      g = exact_div(1.0, amax) * (E4M3_MAX * E2M1_MAX)
    else:
      g = exact_div(amax, E4M3_MAX * E2M1_MAX)
  else:
    g = jnp.broadcast_to(jnp.asarray(global_scale, jnp.float32), blockmax_NG.shape[:-2] + (1, 1))
  g = jnp.where(jnp.isfinite(g) & (g > 0), g, 1.0).astype(jnp.float32)

  if divides:
    raw_NG = g * exact_div(blockmax_NG, E2M1_MAX)
  else:
    raw_NG = exact_div(blockmax_NG, E2M1_MAX * g)
  if divides:
    scales_NG = jnp.minimum(raw_NG, E4M3_MAX).astype(jnp.float8_e4m3fn)
    scales_NG = jnp.where(scales_NG == 0, jnp.float8_e4m3fn(0.125), scales_NG)
  else:
    raw_NG = jnp.where(raw_NG == 0, 1.0, raw_NG)
    scales_NG = jnp.clip(raw_NG, E4M3_MIN_SUBNORMAL, E4M3_MAX).astype(jnp.float8_e4m3fn)

  scales_f32 = scales_NG.astype(jnp.float32)
  eff_NG = exact_div(scales_f32, g) if divides else scales_f32 * g
  # eff can only be 0 if g is subnormal and flushed; keep such blocks at code 0 instead of inf/nan.
  safe_NG = jnp.where(eff_NG > 0, eff_NG, 1.0)[..., None]
  y_NGx = jnp.where(eff_NG[..., None] > 0, exact_div(w_NGx, safe_NG), 0.0)
  codes_NK = e2m1_codes(jnp.clip(y_NGx, -E2M1_MAX, E2M1_MAX)).reshape(w_NK.shape)
  return NVFP4Weight(
    pack_codes(codes_NK), scales_NG, jnp.broadcast_to(g[..., 0], blockmax_NG.shape[:-1]), divides
  )
