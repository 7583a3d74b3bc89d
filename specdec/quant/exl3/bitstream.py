"""The packed trellis bitstream of one 16x16 tile: 256 K-bit symbols in 16*K int16 words.

Symbols sym_0..sym_255 are concatenated MSB-first into one 256*K-bit stream. exllamav3's packer
writes that stream as uint16 words and then swaps the halves of every 32-bit word, so the tile's
int16 array, read as little-endian uint32 words u[0..8K), holds the stream MSB-first:
u[m] = bits [32m, 32m + 32).

The 16-bit state of position t is the 16 stream bits ending where symbol t ends, wrapping around the
end of the stream (tail-biting): bits [(t+1)K - 16, (t+1)K) mod 256K.
Source of truth: exllamav3 `quant/pack.cu` (packer) and `quant/exl3_dq.cuh` (decoder).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

TILE = 256  # weights (and states) per 16x16 tile
MAX_BITS = 8


@functools.cache
def _state_windows(bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per position t: the uint32 words holding its 16-bit window and the shift that aligns it."""
  n_words = TILE * bits // 32
  end_bit = (np.arange(TILE) + 1) * bits + TILE * bits  # + 256K keeps the start bit non-negative
  first_word = (end_bit - 16) // 32
  last_word = (end_bit - 1) // 32  # == first_word when the window sits in one word
  shift = (last_word + 1) * 32 - end_bit  # in [0, 31]
  return first_word % n_words, last_word % n_words, shift.astype(np.uint32)


@functools.partial(jax.jit, static_argnames=("bits",))
def unpack_states(trellis_N: jax.Array, bits: int) -> jax.Array:
  """Packed tiles [..., 16K] int16 -> their 256 states [..., 256] int32 (jit-able)."""
  halves_u32 = jax.lax.bitcast_convert_type(trellis_N, jnp.uint16).astype(jnp.uint32)
  halves_u32 = halves_u32.reshape(*halves_u32.shape[:-1], TILE * bits // 32, 2)
  words_u32 = (halves_u32[..., 1] << 16) | halves_u32[..., 0]  # little-endian pair of int16
  first, last, shift = _state_windows(bits)
  hi_u32, lo_u32 = words_u32[..., first], words_u32[..., last]
  # Funnel shift of the 64-bit (hi, lo) right by `shift`; at shift 0, hi << 32 would be undefined.
  spill_u32 = jnp.where(shift == 0, 0, hi_u32 << ((32 - shift) % 32))
  return (((lo_u32 >> shift) | spill_u32) & 0xFFFF).astype(jnp.int32)


@functools.cache
def _pack_gather(bits: int) -> tuple[np.ndarray, np.ndarray]:
  """For each of the 16K words (in stream order) and each of its 16 bits: source symbol and bit."""
  stream_bit = np.arange(TILE * bits).reshape(TILE * bits // 16, 16)
  return stream_bit // bits, (bits - 1 - stream_bit % bits).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("bits",))
def pack_states(states_NP: jax.Array, bits: int) -> jax.Array:
  """States [..., 256] (any integer dtype) -> packed tiles [..., 16K] int16 (jit-able).

  Only each state's low K bits (its symbol) are stored; the states must form a tail-biting
  shift-register sequence for `unpack_states` to give them back.
  """
  assert 1 <= bits <= MAX_BITS
  symbols_NP = states_NP.astype(jnp.int32) & ((1 << bits) - 1)
  source, shift = _pack_gather(bits)
  bits_NWb = (symbols_NP[..., source] >> shift) & 1
  words_NW = jnp.sum(bits_NWb << (15 - np.arange(16, dtype=np.int32)), axis=-1)
  # Swap the two uint16 halves of every 32-bit word, as exllamav3's packer does.
  words_NW = words_NW.reshape(*words_NW.shape[:-1], -1, 2)[..., ::-1].reshape(words_NW.shape)
  return jax.lax.bitcast_convert_type(words_NW.astype(jnp.uint16), jnp.int16)
