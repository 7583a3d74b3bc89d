"""NVFP4 W4A16 GEMV kernel: decode bits, a bit-faithful CPU model of the kernel, lowering, GPU runs.

The Mosaic GPU kernel emits PTX through `inline_mgpu`, so the Pallas GPU interpreter cannot run it.
On CPU we check (1) the decode and scale bit tricks against E2M1/E4M3 for every code, (2) `emulate`
(the kernel's own step/epilogue code on numpy lanes, with the TMA swizzle and mma fragments) against
the jnp reference, (3) the shared-memory bank conflicts (none for codes and scales, 2-way for x)
and that the checker would see a conflict, and (4) that the kernel lowers to a Mosaic GPU custom
call for the cuda platform (when the model runs it: tests/ops/test_qmatmul.py). `-m gpu` runs the
kernel itself (needs JAX_PLATFORMS=cuda: conftest defaults to cpu).
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from kernels_pallas import bench_util
from kernels_pallas import gemv_common as gemv
from kernels_pallas import nvfp4_gemv as kern
from specdec.quant import nvfp4
from tests.helpers import check_lowers_to_mosaic_gpu, ref_f32
from tests.ptx_interp import run_ptx

# bf16 output of an f32 accumulation: one bf16 rounding (2^-9 relative) dominates; the reference
# dequantizes in f32, the kernel in exact bf16 products, so the two agree far inside this.
TOL = 1e-2


def weight(k, n, seed=0, divides=False):
  w = nvfp4.random_weight(jax.random.key(seed), k, n)
  return nvfp4.NVFP4Weight(w.packed_NP, w.scales_NG, w.global_scale_N, divides)


def in_order(words, order):
  """uint32 words of 8 codes in the checkpoint's order -> the same codes in `order`."""
  packed = np.asarray(words, np.uint32).view(np.uint8).reshape(-1, 4)
  return np.asarray(nvfp4.reorder_bits(packed, "checkpoint", order)).view(np.uint32).reshape(-1)


ORDERS = ("checkpoint", "kernel")


@pytest.mark.parametrize("order", ORDERS)
def test_decode_every_code_in_every_nibble(order):
  codes = np.arange(16, dtype=np.uint32)
  one = np.uint32(0x3F803F80)  # bf16x2 splat of 1.0
  for pos in range(8):
    words = in_order(codes << np.uint32(4 * pos), order)
    pair = kern.decode_word_np(words, np.full(16, one), order)[pos % 4]
    half = pair >> np.uint32(16) if pos >= 4 else pair & np.uint32(0xFFFF)
    got = (half << np.uint32(16)).view(np.float32) * np.float32(2.0**126)
    np.testing.assert_array_equal(got, nvfp4.E2M1_VALUES)


@pytest.mark.parametrize("order", ORDERS)
def test_decode_times_scale_is_exact(order):
  rng = np.random.default_rng(0)
  words = rng.integers(0, 2**32, 256, dtype=np.uint64).astype(np.uint32)
  scale_bytes = rng.integers(0, 0x7F, 256).astype(np.uint8)  # every finite positive E4M3
  splats = kern.scale_splats_np(scale_bytes.astype(np.uint32))[0]
  scales = scale_bytes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
  for p, pair in enumerate(kern.decode_word_np(in_order(words, order), splats, order)):
    for half, nib in ((pair & np.uint32(0xFFFF), p), (pair >> np.uint32(16), p + 4)):
      got = (half << np.uint32(16)).view(np.float32) * np.float32(kern.OUT_SCALE)
      code = (words >> np.uint32(4 * nib)) & np.uint32(0xF)
      np.testing.assert_array_equal(got, nvfp4.E2M1_VALUES[code] * scales)


@pytest.mark.parametrize("order", ORDERS)
def test_decode_ptx_computes_what_the_emulator_models(order):
  rng = np.random.default_rng(1)
  words = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
  splats = kern.scale_splats_np(rng.integers(0, 0x7F, 4096).astype(np.uint32))[0]
  got = run_ptx(kern.decode_ptx(order), 4, words, splats)
  for g, want in zip(got, kern.decode_word_np(words, splats, order), strict=True):
    np.testing.assert_array_equal(g, want)


def test_kernel_order_saves_four_integer_ops_per_word():
  def integer_ops(order):
    lines = [ln.strip() for ln in kern.decode_ptx(order).splitlines()]
    return sum(ln.split()[0] in ("shl.b32", "shr.u32", "and.b32", "lop3.b32") for ln in lines if ln)

  assert (integer_ops("checkpoint"), integer_ops("kernel")) == (15, 11)


def test_scale_splats_cover_all_e4m3():
  b = np.arange(0x7F, dtype=np.uint32)  # 0x7F is NaN
  want = b.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.float32(2.0**118)
  for shift, splat in zip((0, 8), kern.scale_splats_np(b | (b[::-1] << np.uint32(8))), strict=True):
    assert np.all((splat >> np.uint32(16)) == (splat & np.uint32(0xFFFF)))
    got = ((splat & np.uint32(0xFFFF)) << np.uint32(16)).view(np.float32)
    np.testing.assert_array_equal(got, want if shift == 0 else want[::-1])


def test_prmt_pairs_k_and_k_plus_4():
  x0, x1, x2, x3 = (np.array([v], np.uint32) for v in (0x00010000, 0x00030002, 0x00050004, 0x70006))
  assert gemv.prmt_np(x0, x2, gemv.PAIR_LO)[0] == 0x00040000
  assert gemv.prmt_np(x0, x2, gemv.PAIR_HI)[0] == 0x00050001
  assert gemv.prmt_np(x1, x3, gemv.PAIR_LO)[0] == 0x00060002


@pytest.mark.parametrize(
  "m,k,n,config,divides,order",
  [
    (1, 512, 256, kern.TuningConfig(112), False, "kernel"),  # last CTA pulled back
    (3, 512, 144, kern.TuningConfig(48, 2), True, "checkpoint"),
    (8, 768, 256, kern.TuningConfig(128, 2, split_k=3), False, "kernel"),
    (13, 512, 120, kern.TuningConfig(16, 3, split_k=2), True, "checkpoint"),
    (16, 1024, 200, None, False, "kernel"),
    (1, 1024, 256, kern.TuningConfig(112, 2, lines=2), False, "kernel"),  # two lines per step
    (9, 1536, 144, kern.TuningConfig(48, 3, split_k=2, lines=3), True, "checkpoint"),
  ],
)
def test_emulated_kernel_matches_reference(m, k, n, config, divides, order):
  w = weight(k, n, seed=m, divides=divides).in_order(order)
  x = jax.random.normal(jax.random.key(m + 100), (m, k), jnp.bfloat16)
  y = kern.emulate(x, w, config)
  assert bench_util.rel_err(y, ref_f32(x, w)) < 1e-5  # f32 accumulation on both sides


@pytest.mark.parametrize("m", [1, 4, 5, 8, 9, 16])
@pytest.mark.parametrize("tile_n", [16, 48, 112])
def test_shared_memory_reads_are_conflict_free(m, tile_n):
  # Codes and scales: none. x: each 16-byte x read is 2-way (lanes 4 apart in K share banks),
  # 2 or 4 such reads per warp and step against 2 tile_n / 16 code reads.
  x_reads = 4 * 2 * (1 if m <= 8 else 2)  # warps x reads per lane
  for base in (0, 512):  # x slots of odd M start at 512-byte offsets
    got = kern.bank_conflicts(kern.TuningConfig(tile_n), m, slot_base=base)
    assert got == {"w": 0, "s": 0, "x": 4 * x_reads}  # 4 phases, one extra wavefront each


def test_lines_must_divide_k():
  with pytest.raises(ValueError, match="lines=3"):
    kern.TuningConfig(112, lines=3).check(1, 1024, 256)


def test_conflict_checker_sees_unswizzled_reads(monkeypatch):
  monkeypatch.setattr(gemv, "swizzle", lambda offset, line0: offset)
  assert kern.bank_conflicts(kern.TuningConfig(128), 8)["w"] > 0


def test_default_config_balances_the_chip():
  assert kern.default_config(1, 8192, 28672) == kern.TuningConfig(112)  # 256 CTAs, <= 2 per SM
  # 363 CTAs, <= 3 per SM; 3 row blocks: two code lines per step (measured faster there)
  assert kern.default_config(1, 5120, 17408) == kern.TuningConfig(48, 2, lines=2)
  c = kern.default_config(1, 4096, 1024)  # too few rows for 132 SMs: split K
  assert c.split_k > 1 and -(-1024 // c.tile_n) * c.split_k >= 100
  # One CTA per SM (128 of 32 rows) is split 4 ways along K; two per SM (24576 / 96) is not.
  assert kern.default_config(1, 12288, 4096) == kern.TuningConfig(32, split_k=4)
  assert kern.default_config(1, 4096, 24576) == kern.TuningConfig(96)
  # 27B's gate/up: 17 CTAs of 16 rows per SM count fewer rows than 3 of 96, but measured slower.
  assert kern.default_config(1, 5120, 34816) == kern.TuningConfig(96)
  assert kern.default_config(1, 2048, 4096).split_k == 2  # >= 4 steps of 256 k per CTA
  assert kern.default_config(1, 1024, 4096).split_k == 1


@pytest.mark.parametrize(
  "m,k,n,order",
  [(1, 8192, 28672, "kernel"), (16, 5120, 17408, "checkpoint"), (5, 4096, 4096, "kernel")],
)
@pytest.mark.parametrize("lines", [1, 2])
def test_kernel_lowers_for_cuda_on_cpu(m, k, n, order, lines):
  w = jax.eval_shape(lambda: nvfp4.random_weight(jax.random.key(0), k, n).in_order(order))
  config = dataclasses.replace(kern.default_config(m, k, n), lines=lines, max_concurrent_steps=2)
  check_lowers_to_mosaic_gpu(lambda x, w: kern.nvfp4_matmul(x, w, config=config), w, m, k)


def test_check_shape_names_what_the_kernel_cannot_take():
  kern.check_shape(16, weight(512, 128))
  with pytest.raises(ValueError, match="m=17"):
    kern.check_shape(17, weight(512, 128))
  stacked = nvfp4.random_weight(jax.random.key(0), 512, 128, copies=2)
  with pytest.raises(ValueError, match="one weight"):
    kern.check_shape(1, stacked)


def test_bad_shapes_are_rejected():
  with pytest.raises(ValueError, match="m=17"):
    kern.TuningConfig().check(17, 512, 128)
  with pytest.raises(ValueError, match="multiple of 16"):
    kern.TuningConfig(120).check(1, 512, 192)
  with pytest.raises(ValueError, match="divisible by 256"):
    kern.TuningConfig().check(1, 384, 128)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 9, 15, 16])
@pytest.mark.parametrize(
  "k,n,config",
  [
    (4096, 1024, None),
    (1024, 512, kern.TuningConfig(64, 2, 2)),
    (2048, 400, kern.TuningConfig(112, 2, lines=2)),
  ],
)
@pytest.mark.parametrize("order", ORDERS)
def test_kernel_matches_reference_on_gpu(m, k, n, config, order):
  w = weight(k, n, seed=m, divides=m % 2 == 0).in_order(order)
  x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
  y = kern.nvfp4_matmul(x, w, config=config)
  assert bench_util.rel_err(y, ref_f32(x, w)) < TOL


def test_check_case_reports_a_failure_to_compile_and_goes_on(capsys):
  def broken():
    raise ValueError("ptxas: no")

  assert not bench_util.check_case("case A", broken)
  assert bench_util.check_case("case B", lambda: (True, "rel_err 1e-3"))
  assert capsys.readouterr().out == "case A: FAILED ValueError: ptxas: no\ncase B: rel_err 1e-3\n"
