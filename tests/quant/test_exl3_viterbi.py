"""Tail-biting Viterbi: valid sequences, exact recovery of codebook paths, and the scale search."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.quant.exl3.codebook import codebook_lut
from specdec.quant.exl3.scale_search import ScaleSearch, search_scale
from specdec.quant.exl3.viterbi import viterbi_tiles


def _random_path(rng, n_tiles, bits):
  """Random tail-biting state sequences: state t = last 16 bits of the cyclic symbol stream."""
  symbols = rng.integers(0, 1 << bits, size=(n_tiles, 256))
  states = np.zeros_like(symbols)
  for j in range(-(-16 // bits)):
    states |= np.roll(symbols, j, axis=1) << (bits * j)
  return states & 0xFFFF


def _is_tail_biting(states, bits):
  prev = np.roll(states, 1, axis=1)
  return np.all(((prev << bits) & 0xFFFF) == (states & ~((1 << bits) - 1) & 0xFFFF))


@pytest.mark.parametrize(("bits", "codebook"), [(1, "mul1"), (2, "3inst"), (5, "mcg"), (8, "mul1")])
def test_recovers_a_codebook_path_exactly(bits, codebook):
  """A target that some tail-biting path reproduces exactly must be reproduced with zero error."""
  lut = np.asarray(codebook_lut(codebook), np.float32)
  target = lut[_random_path(np.random.default_rng(bits), 2, bits)]
  states, values = viterbi_tiles(jnp.asarray(target), bits, codebook)
  assert _is_tail_biting(np.asarray(states), bits)
  np.testing.assert_array_equal(values, target)
  np.testing.assert_array_equal(lut[np.asarray(states)], values)


def test_chunked_batches_match_one_batch():
  w = jax.random.normal(jax.random.key(0), (5, 256))
  states_one, _ = viterbi_tiles(w, 4, "mul1")
  states_chunked, values = viterbi_tiles(w, 4, "mul1", chunk=2)
  np.testing.assert_array_equal(states_chunked, states_one)
  assert values.shape == (5, 256) and _is_tail_biting(np.asarray(states_chunked), 4)


def test_scale_search_is_equivariant():
  """Tiles twice as large need half the multiplier (same search points, so the same answer)."""
  tiles = jax.random.normal(jax.random.key(1), (8, 256))
  search = ScaleSearch(coarse=(0.4, 0.8, 1.2, 1.6), coarse_stride=2, fine_step=0.1, fine_points=3)
  g1, mse1 = search_scale(tiles, 3, "mul1", search)
  halved = dataclasses.replace(search, coarse=(0.2, 0.4, 0.6, 0.8), fine_step=0.05)
  g2, mse2 = search_scale(2 * tiles, 3, "mul1", halved)
  assert 0.6 < float(g1) < 1.2  # N(0,1) against the unit-RMS mul1 codebook
  assert float(g2) == pytest.approx(float(g1) / 2, rel=1e-5)
  assert float(mse2) == pytest.approx(4 * float(mse1), rel=1e-4)
