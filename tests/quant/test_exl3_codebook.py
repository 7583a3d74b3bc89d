"""The three EXL3 codebooks, against published statistics and an independent per-state oracle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.quant.exl3.codebook import Codebook, codebook_lut, decode_states
from tests.fixtures.exl3 import oracle

# RMS over all 65536 states (research notes §2.3; 3INST's equals exllamav3's codebook_scale).
RMS = {"3inst": 1.2437, "mcg": 1.2441, "mul1": 1.0003}

# Values of states [0, 1, 2, 3, 0x1234, 0xFFFF], computed by the research notes' own scratch script.
STATES = [0, 1, 2, 3, 0x1234, 0xFFFF]
VECTORS = {
  "3inst": [0.76806640625, -0.91943359375, 0.931640625, 0.29443359375, -2.19921875, -0.158203125],
  "mcg": [1.84375, 0.134521484375, -0.75927734375, 0.83984375, 1.5146484375, 0.85009765625],
  "mul1": [
    -3.453125,
    0.64111328125,
    -0.448486328125,
    0.1944580078125,
    -0.5771484375,
    -0.6513671875,
  ],
}


@pytest.mark.parametrize("codebook", list(RMS))
def test_rms_over_all_states(codebook):
  lut = np.asarray(codebook_lut(codebook), np.float64)
  assert lut.shape == (65536,)
  assert np.sqrt(np.mean(lut**2)) == pytest.approx(RMS[codebook], abs=5e-5)


@pytest.mark.parametrize("codebook", list(VECTORS))
def test_published_vectors(codebook):
  got = decode_states(jnp.asarray(STATES), codebook)
  assert got.dtype == jnp.float16
  np.testing.assert_array_equal(np.asarray(got, np.float64), VECTORS[codebook])


@pytest.mark.parametrize("codebook", list(RMS))
def test_every_state_matches_the_oracle_bit_for_bit(codebook):
  want = np.array([oracle.codebook_value(s, codebook) for s in range(65536)], np.float16)
  got = np.asarray(codebook_lut(codebook))
  np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_mul1_fp32_fma_is_exact():
  """The mul1 fma computed in f32 equals the exact (float64) result before the one fp16 rounding."""
  x = (np.arange(65536, dtype=np.uint64) * 0x83DCD12D) & 0xFFFFFFFF
  byte_sum = sum((x >> np.uint64(s)) & np.uint64(0xFF) for s in (0, 8, 16, 24)).astype(np.float64)
  scale, bias = np.array([0x1EEE, 0xC931], np.uint16).view(np.float16).astype(np.float64)
  exact = (1024 + byte_sum) * scale + bias
  f32 = (1024 + byte_sum).astype(np.float32) * np.float32(scale) + np.float32(bias)
  np.testing.assert_array_equal(f32.astype(np.float64), exact)


def test_decode_is_jittable_and_masks_to_16_bits():
  states = jnp.asarray([5, 5 + 65536, 70000], jnp.int32)
  got = jax.jit(decode_states, static_argnums=1)(states, Codebook.MCG)
  assert got[0] == got[1] and got[2] == decode_states(jnp.asarray([70000 - 65536]), "mcg")[0]
