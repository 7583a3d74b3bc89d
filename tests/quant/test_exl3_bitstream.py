"""Trellis bitstream: pack -> decode round trips for every K, checked against a literal oracle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.quant.exl3.bitstream import pack_states, unpack_states
from tests.fixtures.exl3 import oracle

ALL_K = list(range(1, 9))


def _tail_biting_states(symbols_NP: np.ndarray, bits: int) -> np.ndarray:
  """State t = the last 16 bits of the cyclic symbol stream up to and including symbol t."""
  n_back = -(-16 // bits)  # symbols that reach into a 16-bit window
  states = np.zeros(symbols_NP.shape, np.int64)
  for j in range(n_back):
    states |= np.roll(symbols_NP, j, axis=-1).astype(np.int64) << (bits * j)
  return states & 0xFFFF


@pytest.mark.parametrize("bits", ALL_K)
def test_pack_decode_round_trip(bits):
  rng = np.random.default_rng(bits)
  symbols_NP = rng.integers(0, 1 << bits, size=(6, 256))
  states_NP = _tail_biting_states(symbols_NP, bits)
  trellis_NW = pack_states(jnp.asarray(states_NP), bits)
  assert trellis_NW.shape == (6, 16 * bits) and trellis_NW.dtype == jnp.int16
  np.testing.assert_array_equal(unpack_states(trellis_NW, bits), states_NP)
  # The same words as exllamav3's span packer, emulated literally.
  want_NW = np.stack([oracle.pack_tile(list(s), bits) for s in symbols_NP])
  np.testing.assert_array_equal(np.asarray(trellis_NW), want_NW)


@pytest.mark.parametrize("bits", ALL_K)
def test_any_words_decode_like_the_oracle(bits):
  """Every int16 pattern is a valid tile; the fast decoder reads the same windows as the oracle."""
  rng = np.random.default_rng(100 + bits)
  trellis_NW = rng.integers(-(2**15), 2**15, size=(3, 16 * bits)).astype(np.int16)
  want_NP = np.array([oracle.tile_states(t) for t in trellis_NW])
  np.testing.assert_array_equal(unpack_states(jnp.asarray(trellis_NW), bits), want_NP)
  # Decoded states always form a tail-biting shift-register sequence, so they re-pack exactly.
  np.testing.assert_array_equal(pack_states(jnp.asarray(want_NP), bits), trellis_NW)


def test_state_is_the_window_ending_at_its_symbol():
  # K = 4, symbols 0x1, 0x2, ... : state 3 is the four symbols 0..3 = 0x1234.
  states = _tail_biting_states(np.arange(1, 257)[None] % 16, 4)
  assert states[0, 3] == 0x1234
  assert states[0, 0] == 0xEF01  # wraps around: symbols 253, 254, 255 (0xE, 0xF, 0x0) then 0x1
  decoded = unpack_states(pack_states(jnp.asarray(states), 4), 4)
  assert int(decoded[0, 3]) == 0x1234 and int(decoded[0, 0]) == 0xEF01


def test_batched_and_jitted():
  rng = np.random.default_rng(7)
  trellis = jnp.asarray(rng.integers(-(2**15), 2**15, size=(2, 3, 48)).astype(np.int16))
  got = jax.jit(unpack_states, static_argnums=1)(trellis, 3)
  assert got.shape == (2, 3, 256)
  np.testing.assert_array_equal(got[1, 2], unpack_states(trellis[1, 2], 3))
