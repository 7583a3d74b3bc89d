"""specdec.ops.qmatmul.matmul: the one place that picks a quantized weight's kernel or XLA.

On CPU: auto takes XLA for every type; "xla" is dequantize + dot (+ EXL3's bias); on a (pretended)
GPU auto takes the kernel exactly where the kernel's `check_shape` takes the shape, else XLA;
"mosaic" forces the kernel (lowered for cuda here) and keeps its errors; a bad `implementation`
is named. `-m gpu` runs the model's matmul through the kernels.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas.bench_util import rel_err
from kernels_pallas.nvfp4_gemv import reference
from specdec.ops import qmatmul
from specdec.quant import exl3, fp8, nvfp4
from tests.helpers import check_falls_back_to_xla, check_lowers_to_mosaic_gpu

TOL = 1e-2


def weights(k=512, n=256):
  key = jax.random.key(0)
  return {
    "nvfp4": nvfp4.random_weight(key, k, n),
    "nvfp4_kernel_order": nvfp4.random_weight(key, k, n).in_order("kernel"),
    "fp8": fp8.random_weight(key, k, n),
    "exl3": exl3.random_weight(key, k, n, 4, bias=True),
  }


WEIGHTS = weights()


@pytest.fixture
def on_gpu(monkeypatch):
  """What the decision sees on a GPU (nothing here runs a kernel)."""
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")


def dequantize_dot(x, w):
  y = jnp.einsum("...i,io->...o", x, w.dequantize(x.dtype))
  if isinstance(w, exl3.EXL3Weight):
    y = y + w.bias[: w.out_features].astype(y.dtype)
  return y


@pytest.mark.parametrize("name", WEIGHTS)
def test_auto_on_cpu_is_xla_for_every_type(name):
  w = WEIGHTS[name]
  x = jax.random.normal(jax.random.key(1), (2, 3, w.shape[0]), jnp.bfloat16)
  assert not qmatmul.uses_kernel(x, w)
  np.testing.assert_array_equal(qmatmul.matmul(x, w), dequantize_dot(x, w))
  assert "mosaic_gpu" not in jax.jit(qmatmul.matmul).lower(x, w).as_text()


@pytest.mark.parametrize("name", WEIGHTS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_xla_is_dequantize_and_dot_in_xs_dtype(name, dtype):
  w = WEIGHTS[name]
  x = jax.random.normal(jax.random.key(2), (5, w.shape[0]), dtype)
  y = qmatmul.matmul(x, w, implementation="xla")
  assert y.dtype == dtype and y.shape == (5, w.shape[1])
  np.testing.assert_array_equal(y, dequantize_dot(x, w))


@pytest.mark.parametrize("name", ["nvfp4", "fp8"])
def test_the_xla_path_matches_the_f32_reference(name):
  check_falls_back_to_xla(qmatmul.matmul, reference, WEIGHTS[name], TOL)


@pytest.mark.parametrize("name", WEIGHTS)
def test_auto_on_a_gpu_takes_the_kernel_where_it_fits(name, on_gpu):
  w = WEIGHTS[name]
  x = jnp.ones((2, 8, w.shape[0]), jnp.bfloat16)  # M = 16: decode / verify
  assert qmatmul.uses_kernel(x, w)
  assert qmatmul.uses_kernel(x[0, 0], w)  # a single token, M = 1
  assert not qmatmul.uses_kernel(x.astype(jnp.float32), w)  # the kernels take bf16 x
  assert not qmatmul.uses_kernel(jnp.ones((17, w.shape[0]), jnp.bfloat16), w)  # prefill
  stacked = jax.tree.map(lambda a: jnp.stack([a, a]), w)  # a batched (scanned) weight
  assert not qmatmul.uses_kernel(x, stacked)


@pytest.mark.parametrize("name", WEIGHTS)
def test_an_unsupported_shape_under_auto_falls_back_to_xla(name, on_gpu):
  w = WEIGHTS[name]
  x = jax.random.normal(jax.random.key(3), (17, w.shape[0]), jnp.bfloat16)
  np.testing.assert_array_equal(qmatmul.matmul(x, w), dequantize_dot(x, w))


@pytest.mark.parametrize(
  "quant,k,n", [(nvfp4, 384, 256), (nvfp4, 512, 8), (fp8, 320, 256), (fp8, 512, 8)]
)
def test_a_weight_no_kernel_plan_fits_falls_back(quant, k, n, on_gpu):
  # K not a multiple of the kernel's step (NVFP4: 256 k, FP8: 128), or fewer than 16 rows.
  w = quant.random_weight(jax.random.key(0), k, n)
  x = jax.random.normal(jax.random.key(7), (1, k), jnp.bfloat16)
  assert not qmatmul.uses_kernel(x, w)
  np.testing.assert_array_equal(qmatmul.matmul(x, w), dequantize_dot(x, w))


@pytest.mark.parametrize("name", WEIGHTS)
def test_mosaic_forces_the_kernel(name):
  w = jax.eval_shape(lambda: WEIGHTS[name])
  check_lowers_to_mosaic_gpu(
    lambda x, w: qmatmul.matmul(x, w, implementation="mosaic"), w, 3, w.shape[0]
  )


@pytest.mark.parametrize("name", WEIGHTS)
def test_mosaic_keeps_the_kernels_errors(name):
  w = WEIGHTS[name]
  with pytest.raises(ValueError, match="m=17"):
    qmatmul.matmul(jnp.ones((17, w.shape[0]), jnp.bfloat16), w, implementation="mosaic")


def test_a_bad_implementation_is_named():
  w = WEIGHTS["fp8"]
  with pytest.raises(ValueError, match="unknown implementation 'triton'"):
    qmatmul.matmul(jnp.ones((1, 512), jnp.bfloat16), w, implementation="triton")
  with pytest.raises(ValueError, match="unknown implementation 'triton'"):
    qmatmul.matmul(jnp.ones((1, 512)), jnp.ones((512, 4)), implementation="triton")


def test_dense_weights_keep_their_einsum():
  x = jax.random.normal(jax.random.key(4), (2, 3, 8))
  w = jax.random.normal(jax.random.key(5), (8, 4), jnp.bfloat16)
  for implementation in (None, "xla"):
    y = qmatmul.matmul(x, w, implementation=implementation)
    np.testing.assert_array_equal(y, jnp.einsum("...i,io->...o", x, w.astype(x.dtype)))
  with pytest.raises(ValueError, match="dense"):
    qmatmul.matmul(x, w, implementation="mosaic")


def test_a_quantized_type_without_a_kernel_runs_xla_and_refuses_mosaic():
  class Scaled:  # a QuantizedWeight: shape and dequantize only
    shape = (8, 4)

    def dequantize(self, dtype=jnp.bfloat16):
      return jnp.full(self.shape, 2.0, dtype)

  x = jnp.ones((3, 8))
  np.testing.assert_array_equal(qmatmul.matmul(x, Scaled()), jnp.full((3, 4), 16.0))
  with pytest.raises(ValueError, match="no kernel for Scaled"):
    qmatmul.matmul(x, Scaled(), implementation="mosaic")


@pytest.mark.gpu
@pytest.mark.parametrize("name", WEIGHTS)
def test_the_model_matmul_takes_the_kernel_for_decode_only(name):
  w = weights(1024, 512)[name]
  decode = jax.jit(qmatmul.matmul).lower(jnp.ones((1, 16, 1024), jnp.bfloat16), w).as_text()
  prefill = jax.jit(qmatmul.matmul).lower(jnp.ones((17, 1024), jnp.bfloat16), w).as_text()
  assert "mosaic_gpu" in decode and "mosaic_gpu" not in prefill
  x = jax.random.normal(jax.random.key(6), (1, 5, 1024), jnp.bfloat16)
  y = qmatmul.matmul(x, w)
  assert y.shape == (1, 5, 512) and y.dtype == jnp.bfloat16
  assert rel_err(y, dequantize_dot(x.astype(jnp.float32), w)) < TOL
