"""EXL3Weight: tile layout, Hadamard, dequantize against the oracle, and the matmul dispatch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.ops.qmatmul import matmul
from specdec.quant.base import QuantizedWeight
from specdec.quant.exl3 import Codebook, EXL3Weight
from specdec.quant.exl3.hadamard import had_activations, had_cols, had_rows, hadamard_matrix
from specdec.quant.exl3.layout import TENSOR_CORE_PERM, matrix_to_tiles, tiles_to_matrix
from tests.fixtures.exl3 import oracle


def _random_weight(rng, n_in_p, n_out_p, bits, codebook, *, in_features=None, out_features=None):
  trellis = rng.integers(-(2**15), 2**15, size=(n_in_p // 16, n_out_p // 16, 16 * bits))
  suh = rng.choice([-1, 1], n_in_p) * rng.uniform(0.01, 0.1, n_in_p)
  svh = rng.choice([-1, 1], n_out_p) * rng.uniform(0.5, 2.0, n_out_p)
  return EXL3Weight(
    trellis=jnp.asarray(trellis, jnp.int16),
    suh=jnp.asarray(suh, jnp.float16),
    svh=jnp.asarray(svh, jnp.float16),
    bias=None,
    codebook=Codebook(codebook),
    in_features=in_features or n_in_p,
    out_features=out_features or n_out_p,
  )


def test_tensor_core_order():
  assert sorted(TENSOR_CORE_PERM) == list(range(256))
  # Lane 0 decodes rows 0, 1, 8, 9 of columns 0 and 8; lane 5 starts at row 2, column 1.
  assert list(TENSOR_CORE_PERM[:8]) == [0, 16, 128, 144, 8, 24, 136, 152]
  assert TENSOR_CORE_PERM[40] == 2 * 16 + 1
  for t in range(256):
    r, c = oracle.position(t)
    assert TENSOR_CORE_PERM[t] == 16 * r + c


def test_tiles_matrix_inverse():
  w = jnp.arange(32 * 48, dtype=jnp.float32).reshape(32, 48)
  tiles = matrix_to_tiles(w)
  assert tiles.shape == (2, 3, 256)
  assert tiles[1, 2, 8 * 5] == w[16 + 2, 32 + 1]  # tile (1, 2), position 40 -> (row 2, col 1)
  np.testing.assert_array_equal(tiles_to_matrix(tiles), w)


def test_hadamard_is_natural_order_sylvester():
  h = hadamard_matrix()
  np.testing.assert_allclose(h, oracle.sylvester(128), atol=1e-7)
  np.testing.assert_allclose(h @ h, np.eye(128), atol=1e-6)  # symmetric and orthonormal
  w = jax.random.normal(jax.random.key(0), (256, 384))
  h_k, h_n = np.kron(np.eye(2), h), np.kron(np.eye(3), h)
  np.testing.assert_allclose(had_rows(w), h_k @ np.asarray(w), atol=1e-5)
  np.testing.assert_allclose(had_cols(w), np.asarray(w) @ h_n, atol=1e-5)
  # The activation form (multiply and row sum), on [M, N] and with a leading batch dim.
  np.testing.assert_allclose(had_activations(w), np.asarray(w) @ h_n, atol=1e-5)
  np.testing.assert_allclose(had_activations(w[None, :3]), np.asarray(w[None, :3]) @ h_n, atol=1e-5)


@pytest.mark.parametrize(("bits", "codebook"), [(2, "3inst"), (3, "mcg"), (6, "mul1")])
def test_dequantize_matches_oracle(bits, codebook):
  rng = np.random.default_rng(bits)
  w = _random_weight(rng, 128, 256, bits, codebook)
  want_inner = oracle.inner_weight(np.asarray(w.trellis), codebook)
  np.testing.assert_array_equal(w.inner(), want_inner)
  want = oracle.dense_weight(np.asarray(w.trellis), np.asarray(w.suh), np.asarray(w.svh), codebook)
  got = w.dequantize(jnp.float32)
  assert got.shape == w.shape == (128, 256)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_logical_shape_trims_padding():
  w = _random_weight(
    np.random.default_rng(0), 128, 256, 4, "mul1", in_features=100, out_features=200
  )
  assert w.shape == (100, 200) and w.padded_shape == (128, 256) and w.bits == 4
  full = np.asarray(_dense_padded(w))
  np.testing.assert_array_equal(w.dequantize(jnp.float32), full[:100, :200])


def _dense_padded(w):
  return EXL3Weight(w.trellis, w.suh, w.svh, None, w.codebook, *w.padded_shape).dequantize(
    jnp.float32
  )


def test_matmul_dispatch_equals_x_at_dequantize():
  w = _random_weight(np.random.default_rng(1), 128, 256, 3, "mul1", out_features=200)
  assert isinstance(w, QuantizedWeight)
  x = jax.random.normal(jax.random.key(1), (2, 3, 128))
  y = matmul(x, w)
  assert y.shape == (2, 3, 200) and y.dtype == jnp.float32
  np.testing.assert_allclose(y, x @ w.dequantize(jnp.float32), rtol=1e-5, atol=1e-5)
  bias = jax.random.normal(jax.random.key(2), (256,)).astype(jnp.float16)
  wb = EXL3Weight(w.trellis, w.suh, w.svh, bias, w.codebook, w.in_features, w.out_features)
  want = x @ w.dequantize(jnp.float32) + bias[:200].astype(jnp.float32)
  np.testing.assert_allclose(matmul(x, wb), want, rtol=1e-5, atol=1e-5)
  # bf16 activations: dequantize in the activation dtype, output in it too.
  xb = x.astype(jnp.bfloat16)
  np.testing.assert_array_equal(matmul(xb, w), xb @ w.dequantize(jnp.bfloat16))


def test_is_a_pytree_under_jit():
  w = _random_weight(np.random.default_rng(2), 128, 128, 2, "mcg")
  leaves, treedef = jax.tree.flatten(w)
  assert len(leaves) == 3  # trellis, suh, svh (no bias); codebook and dims are static
  x = jnp.ones((4, 128))
  y = jax.jit(matmul)(x, jax.tree.unflatten(treedef, leaves))
  np.testing.assert_allclose(y, matmul(x, w), rtol=1e-6, atol=1e-6)
