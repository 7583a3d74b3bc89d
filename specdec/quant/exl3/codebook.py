"""The three EXL3 procedural codebooks: a 16-bit trellis state -> one fp16 weight.

Each codebook hashes the state with one 32-bit integer multiply (mod 2^32) and turns the hash into a
value with integer ops only, which is what lets a GPU kernel decode weights in registers.
Source of truth: exllamav3 `exllamav3_ext/quant/codebook.cuh` (v1.4.1); there is no written spec.
"""

import enum
import functools

import jax
import jax.numpy as jnp
import numpy as np


class Codebook(enum.StrEnum):
  INST3 = "3inst"  # QTIP's 3INST: no multiplier tensor in the checkpoint
  MCG = "mcg"  # `.mcg` tensor present
  MUL1 = "mul1"  # `.mul1` tensor present; the exllamav3 default since 2026-07


# Multipliers locked by exllamav3 commit 0f2da5d (2025-10-12); kernels never read the stored value.
MCG_MULT = 0xCBAC1FED
MUL1_MULT = 0x83DCD12D
INST3_MULT = 89226354
INST3_ADD = 64248484
# Keep sign + 12 low bits of each fp16 half, then force its exponent into [12, 15]: |half| in
# [1/8, 2).
HALF_PAIR_MASK = 0x8FFF8FFF
HALF_PAIR_XOR = 0x3B603B60
# mul1: fp16 bit patterns of 1/147.77 and -(1024 + 510)/147.77, applied as one fp16 fma.
MUL1_SCALE_BITS = 0x1EEE
MUL1_BIAS_BITS = 0xC931

# RMS over all 65536 states. exllamav3 normalizes every codebook's input to the 3INST RMS
# (`codebook_scale`), whatever the codebook; the global scale search absorbs the difference.
INST3_RMS = 1.24371088


def _fp16_bits_to_f32(bits: int) -> np.float32:
  return np.float32(np.array(bits, np.uint16).view(np.float16))


def _decode_half_pair(x_u32: jax.Array) -> jax.Array:
  x_u32 = (x_u32 & jnp.uint32(HALF_PAIR_MASK)) ^ jnp.uint32(HALF_PAIR_XOR)
  lo = jax.lax.bitcast_convert_type((x_u32 & 0xFFFF).astype(jnp.uint16), jnp.float16)
  hi = jax.lax.bitcast_convert_type((x_u32 >> 16).astype(jnp.uint16), jnp.float16)
  # The exact sum of two such halves fits f32, so one rounding to f16 equals CUDA's __hadd.
  return (lo.astype(jnp.float32) + hi.astype(jnp.float32)).astype(jnp.float16)


def _decode_mul1(x_u32: jax.Array) -> jax.Array:
  byte_sum = (
    (x_u32 & 0xFF) + ((x_u32 >> 8) & 0xFF) + ((x_u32 >> 16) & 0xFF) + (x_u32 >> 24)
  ).astype(jnp.int32)
  h = (byte_sum + 1024).astype(jnp.float32)  # fp16 bits 0x6400 + S is exactly 1024 + S
  # h * scale is a multiple of 2^-18 below 2^4, and so is the bias: the f32 fma is exact, and one
  # rounding to f16 equals CUDA's single-rounding __hfma.
  scale = _fp16_bits_to_f32(MUL1_SCALE_BITS)
  bias = _fp16_bits_to_f32(MUL1_BIAS_BITS)
  return (h * scale + bias).astype(jnp.float16)


@functools.partial(jax.jit, static_argnames=("codebook",))
def decode_states(states: jax.Array, codebook: Codebook | str) -> jax.Array:
  """16-bit states (any integer dtype, any shape) -> fp16 codebook values of the same shape."""
  codebook = Codebook(codebook)
  x_u32 = states.astype(jnp.uint32) & jnp.uint32(0xFFFF)
  if codebook == Codebook.INST3:
    return _decode_half_pair(x_u32 * jnp.uint32(INST3_MULT) + jnp.uint32(INST3_ADD))
  if codebook == Codebook.MCG:
    return _decode_half_pair(x_u32 * jnp.uint32(MCG_MULT))
  return _decode_mul1(x_u32 * jnp.uint32(MUL1_MULT))


def codebook_lut(codebook: Codebook | str) -> jax.Array:
  """All 65536 codebook values, indexed by state (fp16)."""
  return decode_states(jnp.arange(65536, dtype=jnp.uint32), codebook)
