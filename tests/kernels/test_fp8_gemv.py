"""FP8 W8A16 GEMV kernel: decode bits, a bit-faithful CPU model of the kernel, lowering, GPU runs.

The Mosaic GPU kernel emits PTX through `inline_mgpu`, so the Pallas GPU interpreter cannot run it.
On CPU we check (1) the integer decode against E4M3 for every code in every byte of a word, (2)
`emulate` (the kernel's own step on numpy lanes, with nvfp4's swizzle, mma fragments and epilogue)
against the jnp reference, (3) the kernel's shape and input checks, and (4) that the kernel lowers
to a Mosaic GPU custom call for cuda (when the model runs it: tests/ops/test_qmatmul.py). `-m gpu`
runs the kernel itself (needs JAX_PLATFORMS=cuda: conftest defaults to cpu).
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from kernels_pallas import fp8_gemv as kern
from kernels_pallas.bench_util import rel_err
from specdec.quant import fp8
from tests.helpers import check_lowers_to_mosaic_gpu, ref_f32
from tests.ptx_interp import run_ptx

# bf16 output of an f32 accumulation: one bf16 rounding (2^-9 relative) dominates; the kernel's
# products are exact and the reference's dequant rounds once in f32, far inside this.
TOL = 1e-2


def weight(k, n, seed=0):
  return fp8.random_weight(jax.random.key(seed), k, n)


def bf16x2_to_f32(word):
  lo = (word & np.uint32(0xFFFF)) << np.uint32(16)
  hi = word & np.uint32(0xFFFF0000)
  return lo.view(np.float32), hi.view(np.float32)


def test_decode_every_code_in_every_byte():
  codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint32)  # 0x7F/0xFF: NaN
  want = codes.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
  for pos in range(4):
    others = np.uint32(0xA5A5A5A5) & ~(np.uint32(0xFF) << np.uint32(8 * pos))  # neighbours != 0
    even, odd = kern.decode_word_np((codes << np.uint32(8 * pos)) | others)
    lo, hi = bf16x2_to_f32(even if pos % 2 == 0 else odd)
    got = hi if pos >= 2 else lo
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))  # -0 stays -0


def test_decode_ptx_computes_what_the_emulator_models():
  words = np.random.default_rng(0).integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
  for got, want in zip(run_ptx(kern.DECODE_PTX, 2, words), kern.decode_word_np(words), strict=True):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
  "m,k,n,config",
  [
    (1, 512, 256, kern.TuningConfig(112)),  # last CTA pulled back over the previous one
    (3, 384, 144, kern.TuningConfig(48, 2)),  # x slots at 256-byte offsets
    (8, 768, 256, kern.TuningConfig(128, 2, split_k=3)),
    (13, 512, 120, kern.TuningConfig(16, 3, split_k=2)),
    (16, 1024, 200, None),
  ],
)
def test_emulated_kernel_matches_reference(m, k, n, config):
  w = weight(k, n, seed=m)
  x = jax.random.normal(jax.random.key(m + 100), (m, k), jnp.bfloat16)
  y = kern.emulate(x, w, config)
  assert rel_err(y, ref_f32(x, w)) < 1e-5  # f32 accumulation on both sides


def test_emulated_kernel_on_a_quantized_weight():
  # Real quantizer output: per-channel scales, codes concentrated near the E4M3 maximum.
  w_KN = jax.random.normal(jax.random.key(7), (256, 64)) * jnp.linspace(0.01, 3.0, 64)
  w = fp8.quantize(w_KN, per_channel=True)
  x = jax.random.normal(jax.random.key(8), (5, 256), jnp.bfloat16)
  assert rel_err(kern.emulate(x, w), ref_f32(x, w)) < 1e-5


def test_default_config_balances_the_chip():
  assert kern.default_config(1, 8192, 28672) == kern.TuningConfig(112)  # 256 CTAs, <= 2 per SM
  assert kern.default_config(1, 5120, 17408) == kern.TuningConfig(48)  # 363 CTAs, <= 3 per SM
  c = kern.default_config(1, 768, 256)  # too few rows for 132 SMs: split K
  assert c.split_k > 1 and 768 % (kern.TILE_K * c.split_k) == 0


@pytest.mark.parametrize("m,k,n", [(1, 8192, 28672), (16, 5120, 17408), (5, 384, 128)])
def test_kernel_lowers_for_cuda_on_cpu(m, k, n):
  w = jax.eval_shape(lambda: weight(k, n))
  config = kern.default_config(m, k, n)
  check_lowers_to_mosaic_gpu(lambda x, w: kern.fp8_matmul(x, w, config=config), w, m, k)


def test_check_shape_names_what_the_kernel_cannot_take():
  kern.check_shape(16, weight(512, 128))
  with pytest.raises(ValueError, match="m=17"):
    kern.check_shape(17, weight(512, 128))
  with pytest.raises(ValueError, match="one weight"):
    kern.check_shape(1, fp8.random_weight(jax.random.key(0), 512, 128, copies=2))


def test_bad_shapes_are_rejected():
  with pytest.raises(ValueError, match="m=17"):
    kern.TuningConfig().check(17, 512, 128)
  with pytest.raises(ValueError, match="multiple of 16"):
    kern.TuningConfig(120).check(1, 512, 192)
  with pytest.raises(ValueError, match="divisible by 128"):
    kern.TuningConfig().check(1, 320, 128)
  with pytest.raises(ValueError, match="lines=2: the FP8 kernel streams one code line"):
    kern.TuningConfig(lines=2).check(1, 512, 128)
  w = weight(256, 64)
  with pytest.raises(ValueError, match="x_MK has K=128"):
    kern.fp8_matmul(jnp.ones((1, 128), jnp.bfloat16), w)
  with pytest.raises(ValueError, match="scale_N"):
    kern.fp8_matmul(jnp.ones((1, 256), jnp.bfloat16), fp8.FP8Weight(w.codes_NK, w.scale_N[:8]))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 9, 15, 16])
@pytest.mark.parametrize(
  "k,n,config", [(4096, 1024, None), (1024, 512, kern.TuningConfig(64, 2, 2))]
)
def test_kernel_matches_reference_on_gpu(m, k, n, config):
  w = weight(k, n, seed=m)
  x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
  y = kern.fp8_matmul(x, w, config=config)
  assert rel_err(y, ref_f32(x, w)) < TOL
