"""EXL3 trellis GEMV kernel: decode programs, a CPU model of the kernel, lowering, GPU runs.

The Mosaic GPU kernel emits PTX through `inline_mgpu`, so the Pallas GPU interpreter cannot run it.
On CPU we check (1) each decode program's 8 states per lane against specdec.quant.exl3's unpacking
for every K, and its A-fragment registers against the fp16 codebooks, (2) that the programs
assemble for sm_90 (where ptxas is installed), (3) `emulate` (the kernel's own step and epilogue on
numpy lanes) against references, and (4) that the kernel lowers to a Mosaic GPU custom call for
the cuda platform. `-m gpu` runs the kernel itself (needs JAX_PLATFORMS=cuda: conftest defaults
to cpu).
"""

import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas import exl3_decode as dec
from kernels_pallas import exl3_gemv as kern
from kernels_pallas.bench_util import rel_err
from specdec.quant.exl3 import Codebook, EXL3Weight, decode_states, random_weight
from specdec.quant.exl3 import codebook as cb
from specdec.quant.exl3.bitstream import unpack_states
from specdec.quant.exl3.layout import tiles_to_matrix
from tests.helpers import check_lowers_to_mosaic_gpu

CODEBOOKS = list(Codebook)
# The kernel uses each weight's exact codebook value (mul1's affine before its fp16 rounding, the
# half-pair sum unrounded): at most half an fp16 ulp per weight, ~2e-4 relative on a dot product.
INNER_TOL = 1e-3
TOL = 1e-2  # bf16 output of the whole matmul


def f16(bits) -> np.ndarray:
  return np.asarray(bits, np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)


def run_lanes(program, tiles_TW, bits):
  """Every lane of every tile through the program: (register environment, states [T, 256])."""
  u32_TW = np.asarray(tiles_TW).view(np.uint32)
  idx, offset = dec.lane_words(bits)
  envs = []
  for u32_W in u32_TW:
    inputs = [u32_W[idx[:, j]] for j in range(program.n_words)]
    envs.append(program.run_np(inputs + ([offset] if program.runtime_offset else [])))
  return envs


def lane_values(program, env, codebook) -> np.ndarray:
  """A registers -> exact weight values [32 lanes, 8 elements] (before any fp16 rounding)."""
  regs = [env[r] for r in program.outputs]
  if codebook == Codebook.MUL1:
    vals = np.zeros((32, 8))
    for reg, (e0, e1) in zip(regs, ((0, 1), (4, 5), (2, 3), (6, 7)), strict=True):
      vals[:, e0], vals[:, e1] = f16(reg & 0xFFFF), f16(reg >> 16)
    return vals * kern.MUL1_SCALE + kern.MUL1_BIAS
  halves = np.stack([f16(r & 0xFFFF) + f16(r >> 16) for r in regs], 1)
  return halves[:, np.argsort((0, 4, 1, 5, 2, 6, 3, 7))]


def random_tiles(rng, n, bits):
  return rng.integers(-(2**15), 2**15, size=(n, 16 * bits)).astype(np.int16)


@pytest.mark.parametrize("bits", range(1, 9))
def test_states_match_unpacking_for_every_k(bits):
  tiles = random_tiles(np.random.default_rng(bits), 6, bits)
  program = dec.decode_program(bits, Codebook.MUL1)
  want = np.asarray(unpack_states(jnp.asarray(tiles), bits))
  for env, want_P in zip(run_lanes(program, tiles, bits), want, strict=True):
    got_P = np.stack([env[s] for s in program.states], 1).reshape(-1)  # position 8 lane + e
    np.testing.assert_array_equal(got_P, want_P)


@pytest.mark.parametrize("codebook", CODEBOOKS)
@pytest.mark.parametrize("bits", [1, 3, 4, 6, 8])
def test_fragments_round_to_the_fp16_codebook(bits, codebook):
  tiles = random_tiles(np.random.default_rng(10 + bits), 4, bits)
  program = dec.decode_program(bits, codebook)
  want = np.asarray(decode_states(unpack_states(jnp.asarray(tiles), bits), codebook))
  for env, want_P in zip(run_lanes(program, tiles, bits), want, strict=True):
    exact = lane_values(program, env, codebook).reshape(-1)
    np.testing.assert_array_equal(exact.astype(np.float16), want_P)
    assert np.all(np.abs(exact - want_P) <= np.spacing(np.abs(want_P).astype(np.float16)) / 2)


def test_decode_costs_what_the_docstring_says():
  # mul1: per 8 weights 8 IMUL + 8 DP4A + 4 PRMT packs, and the window extraction.
  extraction = {b: dec.decode_program(b, Codebook.MUL1).n_ops - 20 for b in range(1, 9)}
  # The straddle cut makes K = 4's window 1 (11 -> 10) and K = 8's windows 0 and 4 (10 -> 8) one
  # prmt each; no other K has a byte-aligned window across two words.
  assert extraction == {1: 16, 2: 12, 3: 17, 4: 10, 5: 17, 6: 17, 7: 18, 8: 8}
  assert dec.decode_program(4, Codebook.INST3).n_ops == 10 + 16  # mad + lop3 per weight
  ops = [op for op, _, _ in dec.decode_program(4, Codebook.MUL1).instrs]
  counts = {op: ops.count(op) for op in ("prmt.b32", "shr.b32", "shf.l.clamp.b32", "and.b32")}
  assert counts == {"prmt.b32": 7, "shr.b32": 3, "shf.l.clamp.b32": 1, "and.b32": 3}


def test_lop3_table_is_and_then_xor():
  a, b, c = (np.random.default_rng(i).integers(0, 2**32, 64, dtype=np.uint64) for i in range(3))
  got = dec.NUMPY_SEMANTICS["lop3.b32"](a, b, c, dec.AND_XOR_LUT)
  np.testing.assert_array_equal(got, ((a & b) ^ c).astype(np.uint32))


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs CUDA's ptxas")
def test_inline_ptx_assembles_for_sm90(tmp_path):
  lines = [".version 8.0", ".target sm_90", ".address_size 64"]
  for i, (bits, codebook) in enumerate((b, c) for b in range(1, 9) for c in CODEBOOKS):
    program = dec.decode_program(bits, codebook)
    n_out, n_in = len(program.outputs), len(program.inputs)
    body = program.ptx()
    for r in reversed(range(n_out + n_in)):  # $12 before $1
      body = body.replace(f"${r}", f"%r{r}")
    lines += [f".visible .entry k{i}(.param .u64 p) {{", f".reg .b32 %r<{n_out + n_in}>;"]
    lines += [".reg .b64 %a;", "ld.param.u64 %a, [p];"]
    lines += [f"ld.global.u32 %r{n_out + j}, [%a+{4 * j}];" for j in range(n_in)]
    lines += [body] + [f"st.global.u32 [%a+{4 * j}], %r{j};" for j in range(n_out)] + ["ret;", "}"]
  mma = kern.MMA_F16_PTX
  for r in reversed(range(14)):
    mma = mma.replace(f"${r}", f"%m{r}")
  lines += [".visible .entry mma(.param .u64 p) {", ".reg .b32 %m<14>;", ".reg .b64 %a;"]
  lines += ["ld.param.u64 %a, [p];"] + [f"ld.global.u32 %m{j}, [%a+{4 * j}];" for j in range(14)]
  lines += [mma, "st.global.u32 [%a], %m0;", "ret;", "}"]
  src = tmp_path / "decode.ptx"
  src.write_text("\n".join(lines))
  r = subprocess.run(
    ["ptxas", "-arch=sm_90", str(src), "-o", str(tmp_path / "decode.cubin")],
    capture_output=True,
    text=True,
  )
  assert r.returncode == 0, r.stderr


def unrounded_inner(w: EXL3Weight) -> np.ndarray:
  """W_hat from the states in float64 with the kernel's arithmetic: no fp16 rounding of values."""
  states = np.asarray(w.states()).astype(np.uint64)
  if w.codebook == Codebook.MUL1:
    h = (states * np.uint64(cb.MUL1_MULT)) & np.uint64(0xFFFFFFFF)
    byte_sum = sum((h >> np.uint64(s)) & np.uint64(255) for s in range(0, 32, 8))
    vals = (1024 + byte_sum.astype(np.float64)) * kern.MUL1_SCALE + kern.MUL1_BIAS
  else:
    mult, add = (cb.MCG_MULT, 0) if w.codebook == Codebook.MCG else (cb.INST3_MULT, cb.INST3_ADD)
    x = (states * np.uint64(mult) + np.uint64(add)) & np.uint64(0xFFFFFFFF)
    x = (x & np.uint64(cb.HALF_PAIR_MASK)) ^ np.uint64(cb.HALF_PAIR_XOR)
    vals = f16(x & np.uint64(0xFFFF)) + f16(x >> np.uint64(16))
  return tiles_to_matrix(vals)


@pytest.mark.parametrize(
  "m,k,n,bits,codebook,config",
  [
    (1, 512, 256, 4, "mul1", kern.TuningConfig(4, 16)),
    (5, 512, 384, 3, "3inst", kern.TuningConfig(5, 8, 2, split_k=2)),  # last CTA clamped
    (9, 256, 128, 8, "mcg", None),
    (16, 512, 128, 2, "mul1", kern.TuningConfig(3, 4, 3, split_k=4)),
    (8, 256, 256, 5, "mul1", None),
    (9, 256, 384, 8, "mul1", kern.TuningConfig(2, 8, 2, split_k=2)),  # K = 8 straddle cuts
    (16, 256, 128, 8, "3inst", kern.TuningConfig(2, 4)),
  ],
)
def test_emulated_kernel_matches_reference(m, k, n, bits, codebook, config):
  w = random_weight(jax.random.key(bits), k, n, bits, codebook)
  xh = jax.random.normal(jax.random.key(m), (m, k), jnp.float32)
  x16 = np.asarray(xh.astype(jnp.float16), np.float64)
  y = kern.emulate(xh, w.trellis, Codebook(codebook), config)
  if codebook == "mul1":  # the kernel's part ends at the slope; XLA adds b * sum(x')
    y = y + kern.MUL1_BIAS * x16.sum(1, keepdims=True)
  assert rel_err(y, x16 @ unrounded_inner(w)) < 1e-5  # f32 accumulation
  assert rel_err(y, kern.inner_reference(xh, w)) < INNER_TOL


def test_x_fragments_put_each_lanes_values_together():
  x = jnp.arange(32, dtype=jnp.float16).reshape(1, 32)
  mul1 = np.asarray(kern.x_fragments(x, Codebook.MUL1))
  assert mul1.shape == (2, 1, 16)
  np.testing.assert_array_equal(mul1[1, 0, 4:8], [18, 19, 26, 27])  # lane q = 1 of k-tile 1
  pairs = np.asarray(kern.x_fragments(x, Codebook.INST3))
  np.testing.assert_array_equal(pairs[0, 0, 8:16], [2, 2, 3, 3, 10, 10, 11, 11])


@pytest.mark.parametrize(
  "m,k,n,bits,codebook,config",
  [
    (1, 8192, 28672, 4, "mul1", None),
    (16, 5120, 17408, 3, "3inst", None),
    (16, 8192, 28672, 8, "mul1", kern.TuningConfig(2, 8)),
  ],
)
def test_kernel_lowers_for_cuda_on_cpu(m, k, n, bits, codebook, config):
  w = jax.eval_shape(lambda: random_weight(jax.random.key(0), k, n, bits, codebook))
  check_lowers_to_mosaic_gpu(lambda x, w: kern.exl3_matmul(x, w, config=config), w, m, k)


def test_default_config_balances_the_chip():
  # 8192 x 28672: 896 CTAs of 2 n-tiles (<= 7 per SM, 97% balance), 32 k-tiles per step; the
  # fastest measured M = 1 configuration but one (tiles_k 64 / 3 stages: 50.0 against 50.4 us).
  assert kern.default_config(1, 512, 1792, 4) == kern.TuningConfig(2, 32)
  assert kern.default_config(16, 512, 1792, 8).tiles_k == 16  # 32 would overflow the SMEM bound
  c = kern.default_config(1, 320, 1088, 4)  # 5120 x 17408
  ctas = -(-1088 // c.tiles_n) * c.split_k
  assert ctas >= 2 * kern.NUM_SMS and -(-ctas // kern.NUM_SMS) * c.tiles_n <= 1.1 * 1088 / 132
  assert kern.default_config(1, 16, 16, 4).split_k == 1  # the zoo's 256 x 256: one step, no split


def test_check_shape_names_what_the_kernel_cannot_take():
  w = random_weight(jax.random.key(0), 256, 384, 4)
  kern.check_shape(16, w)
  with pytest.raises(ValueError, match="m=17"):
    kern.check_shape(17, w)
  stacked = jax.tree.map(lambda a: a[None], w)
  with pytest.raises(ValueError, match="one weight"):
    kern.check_shape(1, stacked)


def test_bad_shapes_are_rejected():
  with pytest.raises(ValueError, match="m=17"):
    kern.TuningConfig().check(17, 512, 128, 4, Codebook.MUL1)
  with pytest.raises(ValueError, match="tiles_n=9"):
    kern.TuningConfig(9).check(1, 512, 8, 4, Codebook.MUL1)
  with pytest.raises(ValueError, match="tiles_k=6"):
    kern.TuningConfig(4, 6).check(1, 512, 128, 4, Codebook.MUL1)
  with pytest.raises(ValueError, match="SMEM"):
    kern.TuningConfig(16, 16, 8).check(16, 512, 128, 8, Codebook.INST3)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize(
  "bits,codebook,config",
  [
    (4, "mul1", None),
    (2, "mul1", kern.TuningConfig(5, 8, 2, split_k=2)),
    (3, "3inst", None),
    (5, "mcg", None),
    (8, "mul1", kern.TuningConfig(3, 8, 3)),
  ],
)
def test_kernel_matches_reference_on_gpu(m, bits, codebook, config):
  w = random_weight(jax.random.key(bits * 17 + m), 1024, 896, bits, codebook)
  xh = jax.random.normal(jax.random.key(m), (m, 1024), jnp.float32)
  y = kern.inner_matmul(xh, w, config)
  assert np.all(np.isfinite(np.asarray(y)))
  assert rel_err(y, kern.inner_reference(xh, w)) < INNER_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 16])
def test_full_matmul_on_gpu(m):
  w = random_weight(jax.random.key(m), 1024, 768, 4, bias=True)
  w = EXL3Weight(w.trellis, w.suh, w.svh, w.bias, w.codebook, 1000, 700)  # padded dims
  x = jax.random.normal(jax.random.key(m + 1), (m, 1000), jnp.bfloat16)
  y = kern.exl3_matmul(x, w)
  assert y.shape == (m, 700)
  assert rel_err(y, kern.reference(x, w)) < TOL
