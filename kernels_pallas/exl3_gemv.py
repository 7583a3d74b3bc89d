"""EXL3 trellis GEMV / skinny GEMM for Hopper: x [M, K] bf16 @ W -> [M, N], M = 1..16, K bits 1..8.

W = diag(suh) . H . W_hat . H . diag(svh) (specdec/quant/exl3/weight.py; layout: docs/design.md,
"Quantized weights"). The rotations act on [M, 128-blocks] and are XLA ops: x' = had(x * suh) goes
in as fp16, the kernel computes x' @ W_hat straight from the trellis, and had(y') * svh (+ bias)
comes after. Each rotation is a multiply and a row sum (`had_activations`), not a dot, so XLA
fuses it with the scaling and casts beside it. Prefill (M > 16) reconstructs W and lets XLA
multiply (specdec.ops.qmatmul, which decides kernel or XLA).

Mosaic GPU (`plgpu.kernel` + `plgpu.emit_pipeline`, TMA into SMEM), the per-tile decode as
straight-line PTX through `plgpu.inline_mgpu` (kernels_pallas/exl3_decode.py); the pipeline,
epilogue and lane model are kernels_pallas/gemv_common.py's. One CTA = one warpgroup owning
`tiles_n` 16-column tiles of W_hat. K streams in steps of `tiles_k` 16-row tiles: per step the
trellis block [tiles_k, tiles_n, 16 K] int16 (the checkpoint's own layout, unpermuted) and x'
[tiles_k, M, 16]. Warp w takes k-tiles w, w + 4, ... of the step for every n-tile, so each x'
fragment is read by one warp; the four warps' f32 mma partials are summed through SMEM at the end.
The weight is the mma's A operand and the tokens its B (8 per mma, two mma for M > 8), so each
lane decodes its own 8 weights and nothing is shuffled. The last CTA's columns are clamped to end
at N; split_k > 1 writes f32 partials that XLA sums. Below K = 8 the bound is the decode's issue
rate, not HBM.

Testing without a GPU: `emulate()` runs the kernel's own step and epilogue on numpy lanes; the CPU
tests check it against the jnp reference, the decode's states against specdec.quant.exl3's
unpacking for every K, and that the kernel lowers for cuda. Figures, the sweep, the straddle cut's
gain, tried variants and the in-model gate: docs/benchmarks.md ("Kernel notes moved from the code").
"""

import dataclasses
import functools
import math
import sys
import time

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np

from kernels_pallas import bench_util
from kernels_pallas import exl3_decode as dec
from kernels_pallas import gemv_common as gemv
from kernels_pallas.h200 import COPY_CEILING_TBS, NUM_SMS, SMEM_BYTES
from specdec.quant.exl3.codebook import MUL1_BIAS_BITS, MUL1_SCALE_BITS, Codebook
from specdec.quant.exl3.hadamard import had_activations
from specdec.quant.exl3.weight import EXL3Weight, random_weight

TILE = 16  # rows and columns of one trellis tile
WARPS = 4
M_MAX = 16
MAX_BITS = 8
MUL1_SCALE = float(np.array(MUL1_SCALE_BITS, np.uint16).view(np.float16))
MUL1_BIAS = float(np.array(MUL1_BIAS_BITS, np.uint16).view(np.float16))

MMA_F16_PTX = (
  "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
  "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
)

# x' columns of one 16-column k-tile in the order lane q reads them: mul1 needs (2q, 2q+1) and
# (2q+8, 2q+9) as the two B registers; 3INST/MCG the same four values each twice, one per half.
_X_ORDER_MUL1 = np.array([c for q in range(4) for c in (2 * q, 2 * q + 1, 2 * q + 8, 2 * q + 9)])
_X_ORDER_PAIRS = np.repeat(_X_ORDER_MUL1, 2)


def x_order(codebook: Codebook) -> np.ndarray:
  return _X_ORDER_MUL1 if codebook == Codebook.MUL1 else _X_ORDER_PAIRS


@dataclasses.dataclass(frozen=True)
class TuningConfig:
  tiles_n: int = 2  # 16-column tiles per CTA
  tiles_k: int = 32  # 16-row tiles per pipeline step, a multiple of the 4 warps
  max_concurrent_steps: int = 4  # TMA pipeline depth
  split_k: int = 1  # CTAs along K; > 1 writes f32 partials that XLA sums

  def stage_bytes(self, m: int, bits: int, codebook: Codebook) -> int:
    return self.tiles_k * (self.tiles_n * 32 * bits + m * 2 * len(x_order(codebook)))

  def check(self, m: int, k16: int, n16: int, bits: int, codebook: Codebook) -> None:
    if not 1 <= m <= M_MAX:
      raise ValueError(f"x has {m=} rows; the kernel takes 1..{M_MAX}")
    if not 1 <= bits <= MAX_BITS:
      raise ValueError(f"trellis has {bits=} bits per weight; expected 1..{MAX_BITS}")
    if not 1 <= self.tiles_n <= min(n16, 16):
      raise ValueError(f"tiles_n={self.tiles_n} must be in [1, min(N/16={n16}, 16)]")
    if self.split_k < 1 or self.max_concurrent_steps < 1:
      raise ValueError(f"{self}: split_k and max_concurrent_steps must be >= 1")
    if self.tiles_k % WARPS or k16 % (self.tiles_k * self.split_k):
      raise ValueError(
        f"tiles_k={self.tiles_k} must be a multiple of {WARPS} and tiles_k * split_k="
        f"{self.tiles_k * self.split_k} must divide K/16={k16}"
      )
    smem = self.max_concurrent_steps * self.stage_bytes(m, bits, codebook)
    if smem > SMEM_BYTES // 2:
      # Under half the SM's SMEM, so that two CTAs (two warpgroups) can share an SM.
      raise ValueError(f"{self} needs {smem} B of SMEM for its pipeline, over {SMEM_BYTES // 2}")


def default_config(m: int, k16: int, n16: int, bits: int, codebook=Codebook.MUL1) -> TuningConfig:
  """The n-tiles per CTA (and split K) that leave the busiest SM the least work, with at least two
  CTAs per SM where the shape allows; larger CTAs on ties; then the most k-tiles per step that
  fit (balance and fewer, larger steps both paid on the sweep in docs/benchmarks.md, where the
  one split-K point measured was the slowest per byte)."""
  best = None
  for split in (1, 2, 4, 8):
    for tn in range(min(n16, 16), 0, -1):
      for tk in (32, 16, 8, 4):
        config = TuningConfig(tn, tk, split_k=split)
        if split > 1 and k16 // (tk * split) < config.max_concurrent_steps:
          continue  # a split that cannot fill its own pipeline only adds XLA's partial sum
        try:
          config.check(m, k16, n16, bits, Codebook(codebook))
        except ValueError:
          continue
        ctas = math.ceil(n16 / tn) * split
        busiest = math.ceil(ctas / NUM_SMS) * tn / split * (1 + 0.25 * (split > 1))
        key = (ctas < 2 * NUM_SMS, busiest)
        if best is None or key < best[0]:
          best = (key, config)
        break  # the largest tiles_k that fits: each step costs a TMA wait and a barrier
  if best is None:
    raise ValueError(f"no kernel configuration fits {m=}, K/16={k16}, N/16={n16}, {bits=}")
  return best[1]


# ------------------------------------------------------------------------------------------------
# The per-step algorithm, written once for the emitter and the numpy emulator.


@dataclasses.dataclass(frozen=True)
class _Shape:
  m: int
  bits: int
  codebook: Codebook
  config: TuningConfig

  @property
  def token_tiles(self) -> int:
    return 1 if self.m <= 8 else 2

  @property
  def x_bytes(self) -> int:
    """Bytes of x' per k-tile and token."""
    return 2 * len(x_order(self.codebook))

  @property
  def tile_bytes(self) -> int:
    return 32 * self.bits


def _step(ops, s: _Shape, w_buf, x_buf, acc):
  """One pipeline step for one warp: k-tiles 4 i + warp of the step, every n-tile. `acc[j, t]` are
  the 4 f32 C-fragment values of n-tile j (rows g, g + 8) and token tile t."""
  warp, g, q = gemv.lanes(ops.tid)
  tn, program = s.config.tiles_n, dec.decode_program(s.bits, s.codebook)
  start = dec.lane_start_bit(ops.tid & 31, s.bits)
  word_off = [ops.mod((start >> 5) + j, 8 * s.bits) * 4 for j in range(program.n_words)]
  offset = [start & 31] if program.runtime_offset else []
  w_base = warp * (tn * s.tile_bytes)
  x_base = warp * (s.m * s.x_bytes) + q * (s.x_bytes // 4)
  n_x = s.x_bytes // 16  # 32-bit words per lane and token tile
  xs, words = {}, {}
  for i in range(s.config.tiles_k // WARPS):
    for t in range(s.token_tiles):
      tok = ops.min(g + 8 * t, s.m - 1)  # padded tokens repeat the last one; their columns drop
      x_off = x_base + tok * s.x_bytes + WARPS * i * s.m * s.x_bytes
      xs[i, t] = ops.load(x_buf, x_off, n_x, swizzled=False)
    for j in range(tn):
      tile = w_base + (WARPS * i * tn + j) * s.tile_bytes
      words[i, j] = [ops.load(w_buf, tile + off, 1, swizzled=False)[0] for off in word_off]
  ops.release()  # every SMEM read of this slot is done; the pipeline may refill it
  for (i, j), tile_words in words.items():
    a = ops.decode(program, tile_words + offset)
    for t in range(s.token_tiles):
      for u in range(len(a) // 4):
        acc[j, t] = ops.mma(a[4 * u : 4 * u + 4], xs[i, t][2 * u : 2 * u + 2], acc[j, t])
  return acc


def out_scale(codebook: Codebook) -> float:
  """What the kernel multiplies its sums by: mul1's codebook slope; 1 for the half-pair codes."""
  return MUL1_SCALE if codebook == Codebook.MUL1 else 1.0


# ------------------------------------------------------------------------------------------------
# Numpy model of one warpgroup.

_A_REGS = ((0, 0), (8, 0), (0, 8), (8, 8))  # (row, k) offsets of the 4 A registers
_C_REGS = ((0, 0), (0, 1), (8, 0), (8, 1))  # (row, column) offsets of the 4 accumulators


def _f16_halves(word) -> list[np.ndarray]:
  w = np.asarray(word, np.uint32)
  halves = [(w >> np.uint32(s)) & np.uint32(0xFFFF) for s in (0, 16)]
  return [h.astype(np.uint16).view(np.float16).astype(np.float64) for h in halves]


class _NumpyOps(gemv.NumpyOps):
  def __init__(self, scale: float):
    super().__init__()
    self.scale = np.float32(scale)

  def mod(self, a, n: int):
    return np.asarray(a, np.uint32) % np.uint32(n)

  def decode(self, program: dec.DecodeProgram, inputs):
    env = program.run_np(inputs)
    return [env[r] for r in program.outputs]

  def mma(self, a, b, c):
    """m16n8k16 f16 -> f32 on the fragments of all four warps at once."""
    lane = self.tid & 31
    w, g, q = self.tid >> 5, lane >> 2, lane & 3
    a_wrk = np.zeros((4, 16, 16))
    b_wkn = np.zeros((4, 16, 8))
    for reg, (dr, dk) in zip(a, _A_REGS, strict=True):
      for h, v in enumerate(_f16_halves(reg)):
        a_wrk[w, g + dr, 2 * q + dk + h] = v
    for reg, dk in zip(b, (0, 8), strict=True):
      for h, v in enumerate(_f16_halves(reg)):
        b_wkn[w, 2 * q + dk + h, g] = v
    d_wrn = a_wrk @ b_wkn
    return [
      (d_wrn[w, g + dr, 2 * q + dc] + c[i]).astype(np.float32) for i, (dr, dc) in enumerate(_C_REGS)
    ]

  def out_factor(self, g_ref, row, divides):
    del g_ref, row, divides
    return self.scale


def emulate(
  x_MK, trellis_KNW, codebook: Codebook, config: TuningConfig | None = None
) -> np.ndarray:
  """The kernel's data movement and arithmetic on numpy: x' (rounded to fp16) -> f32 [M, N] sums
  times `out_scale` (mul1's b * sum(x') is XLA's part, see `inner_matmul`)."""
  x16 = np.asarray(x_MK, np.float32).astype(np.float16)
  trellis = np.asarray(trellis_KNW)
  m = x16.shape[0]
  k16, n16, w16 = trellis.shape
  codebook = Codebook(codebook)
  config = config or default_config(m, k16, n16, w16 // 16, codebook)
  config.check(m, k16, n16, w16 // 16, codebook)
  s = _Shape(m, w16 // 16, codebook, config)
  tn, tk = config.tiles_n, config.tiles_k
  xf = np.asarray(x_fragments(x16, codebook))
  ops = _NumpyOps(out_scale(codebook))
  out = np.zeros((config.split_k, m, n16 * TILE), np.float32)
  steps = k16 // tk // config.split_k
  for blk in range(math.ceil(n16 / tn)):
    n0 = min(blk * tn, n16 - tn)
    for split in range(config.split_k):
      acc = {
        (j, t): [np.zeros(128, np.float32) for _ in range(4)]
        for j in range(tn)
        for t in range(s.token_tiles)
      }
      for step in range(split * steps, (split + 1) * steps):
        ks = slice(step * tk, (step + 1) * tk)
        w_buf = gemv.SmemImage(trellis[ks, n0 : n0 + tn], 0, swizzled=False)
        x_buf = gemv.SmemImage(xf[ks], 0, swizzled=False)
        acc = _step(ops, s, w_buf, x_buf, acc)
      red = np.full((WARPS, tn * TILE, 8 * s.token_tiles), np.nan, np.float32)
      cols = out[split][:, n0 * TILE : (n0 + tn) * TILE]
      gemv.epilogue(ops, tn, s.token_tiles, m, acc, red, None, cols, False)
  return out.sum(0)


# ------------------------------------------------------------------------------------------------
# MLIR emitter.


class _MlirOps(gemv.MlirOps):
  def __init__(self, scale: float):
    super().__init__()
    self.scale = scale

  def mod(self, a, n: int):
    return gemv.I32(gemv.mlir()[1].remui(a.v, gemv.I32.raw(n)))

  def decode(self, program: dec.DecodeProgram, inputs):
    args = [v.v if isinstance(v, gemv.I32) else v for v in inputs]
    out = gemv.mlir()[-1].inline_ptx(
      program.ptx(), *args, result_types=[self.i32] * len(program.outputs)
    )
    return list(out)

  def mma(self, a, b, c):
    return list(gemv.mlir()[-1].inline_ptx(MMA_F16_PTX, *a, *b, *c, result_types=[self.f32] * 4))

  def out_factor(self, g_ref, row, divides):
    del g_ref, row, divides
    ir, arith, *_ = gemv.mlir()
    return arith.constant(self.f32, ir.FloatAttr.get(self.f32, self.scale))


# ------------------------------------------------------------------------------------------------
# The kernel.


def _mosaic_inner(xf_KMX: jax.Array, trellis_KNW: jax.Array, s: _Shape) -> jax.Array:
  """x' fragments [K/16, M, 16 or 32] f16 and the trellis -> f32 partials [split_k, M, N]."""
  k16, n16, w16 = trellis_KNW.shape
  config, m = s.config, s.m
  config.check(m, k16, n16, s.bits, s.codebook)
  tn, tk, splits = config.tiles_n, config.tiles_k, config.split_k
  steps = k16 // tk // splits
  acc_shape = (64 * tn, 8 * s.token_tiles)
  acc_type = plgpu.ShapeDtypeStruct(acc_shape, jnp.float32, layout=plgpu.Layout.WGMMA)
  scale = out_scale(s.codebook)

  @plgpu.inline_mgpu(
    arg_types=(plgpu.RefType(), plgpu.RefType(), plgpu.Layout.WGMMA), return_type=acc_type
  )
  def step(ctx, w_ref, x_ref, acc_fa):
    del ctx
    ops = _MlirOps(scale)
    acc = gemv.acc_unpack(acc_fa, tn, s.token_tiles)
    w_buf, x_buf = (ops.smem(r, 0) for r in (w_ref, x_ref))  # unswizzled: the line is unused
    acc = _step(ops, s, w_buf, x_buf, acc)
    return gemv.acc_pack(acc, acc_fa, tn, s.token_tiles)

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType(), plgpu.RefType()))
  def epilogue(ctx, acc_fa, red_ref, o_ref):
    del ctx
    ops = _MlirOps(scale)
    acc = gemv.acc_unpack(acc_fa, tn, s.token_tiles)
    gemv.epilogue(ops, tn, s.token_tiles, m, acc, red_ref, None, o_ref, False)

  def kernel(x_gmem, t_gmem, o_gmem):
    n0 = jnp.minimum(jax.lax.axis_index("n") * tn, n16 - tn)
    k0 = jax.lax.axis_index("k") * steps
    specs = [
      plgpu.BlockSpec((tk, tn, w16), lambda i: (k0 + i, 0, 0)),
      plgpu.BlockSpec((tk, m, xf_KMX.shape[-1]), lambda i: (k0 + i, 0, 0)),
    ]
    pipeline = gemv.acc_pipeline(step, specs, steps, config.max_concurrent_steps, acc_shape)
    acc = pipeline(t_gmem.at[:, pl.ds(n0, tn)], x_gmem)
    out = o_gmem.at[jax.lax.axis_index("k"), :, pl.ds(n0 * TILE, tn * TILE)]
    # The pipeline's buffers are free again here, so the reduction scratch reuses their SMEM.
    pl.run_scoped(
      lambda red: epilogue(acc, red, out),
      plgpu.SMEM((WARPS, tn * TILE, 8 * s.token_tiles), jnp.float32),
    )

  out_type = jax.ShapeDtypeStruct((splits, m, n16 * TILE), jnp.float32)
  call = gemv.launch(kernel, out_type, math.ceil(n16 / tn), splits)
  return call(xf_KMX, trellis_KNW)


def x_fragments(x16_MK: jax.Array, codebook: Codebook) -> jax.Array:
  """x' [M, K] f16 -> [K/16, M, 16 | 32]: per k-tile and token, lane q's x' values contiguous."""
  m, k = x16_MK.shape
  return jnp.asarray(x16_MK).reshape(m, k // TILE, TILE)[..., x_order(codebook)].transpose(1, 0, 2)


# ------------------------------------------------------------------------------------------------
# Public entry points.


def inner_reference(xh_MK: jax.Array, w: EXL3Weight) -> jax.Array:
  """Plain jnp: fl16(x') @ W_hat in f32 (W_hat: the fp16 codebook values)."""
  x_MK = xh_MK.astype(jnp.float16).astype(jnp.float32)
  return jnp.dot(x_MK, w.inner(), precision="highest")


def reference(x_MK: jax.Array, w: EXL3Weight) -> jax.Array:
  """Plain jnp: the f32 dense weight, f32 matmul (+ bias), bf16 result."""
  y_MN = jnp.dot(x_MK.astype(jnp.float32), w.dequantize(jnp.float32), precision="highest")
  if w.bias is not None:
    y_MN = y_MN + w.bias[: w.out_features].astype(jnp.float32)
  return y_MN.astype(jnp.bfloat16)


def _config_for(m: int, w: EXL3Weight, config: TuningConfig | None) -> TuningConfig:
  k16, n16, _ = w.trellis.shape
  return config or default_config(m, k16, n16, w.bits, w.codebook)


def inner_matmul(xh_MK: jax.Array, w: EXL3Weight, config: TuningConfig | None = None):
  """fl16(x') [M, in_p] @ W_hat -> f32 [M, out_p] through the kernel (mul1's affine ends here)."""
  m = xh_MK.shape[0]
  s = _Shape(m, w.bits, w.codebook, _config_for(m, w, config))
  x16_MK = xh_MK.astype(jnp.float16)
  y_MN = _mosaic_inner(x_fragments(x16_MK, w.codebook), w.trellis, s).sum(0)
  if w.codebook == Codebook.MUL1:
    y_MN = y_MN + MUL1_BIAS * jnp.sum(x16_MK.astype(jnp.float32), axis=1, keepdims=True)
  return y_MN


def check_shape(m: int, w: EXL3Weight) -> None:
  """Raises ValueError unless the kernel takes x [m, in] @ w: an unbatched trellis and a default
  config whose check passes (what specdec.ops.qmatmul asks before it picks the kernel)."""
  if w.trellis.ndim != 3:
    raise ValueError(f"the EXL3 kernel takes one weight, got trellis {w.trellis.shape}")
  k16, n16, _ = w.trellis.shape
  _config_for(m, w, None).check(m, k16, n16, w.bits, w.codebook)


@functools.partial(jax.jit, static_argnames=("config",))
def exl3_matmul(x_MK: jax.Array, w: EXL3Weight, *, config: TuningConfig | None = None):
  """x [M, in] @ W (+ bias) -> [M, out] in x's dtype: XLA's rotations around the kernel's
  x' @ W_hat (`default_config`'s plan if config is None; one that does not fit raises
  ValueError). When the model runs it: specdec.ops.qmatmul.matmul."""
  n_in_p, n_out_p = w.padded_shape
  x_MK32 = jnp.pad(x_MK.astype(jnp.float32), ((0, 0), (0, n_in_p - x_MK.shape[1])))
  xh_MK = had_activations(x_MK32 * w.suh.astype(jnp.float32))
  y_MN = had_activations(inner_matmul(xh_MK, w, config)) * w.svh.astype(jnp.float32)
  if w.bias is not None:
    y_MN = y_MN + w.bias.astype(jnp.float32)
  return y_MN[:, : w.out_features].astype(x_MK.dtype)


# ------------------------------------------------------------------------------------------------
# Benchmark and GPU check.


def _bench_kernel(x, ws: list[EXL3Weight], config: TuningConfig, iterations: int, op: bool):
  """Compile time and error of `inner_matmul`; CUPTI time of the kernel alone over the copies
  and, if `op`, of the whole `exl3_matmul`."""
  one = jax.jit(functools.partial(inner_matmul, config=config))
  t0 = time.perf_counter()
  compiled = one.lower(x, ws[0]).compile()
  row = {"compile_s": time.perf_counter() - t0}
  row["rel_err"] = bench_util.rel_err(compiled(x, ws[0]), inner_reference(x, ws[0]))
  s = _Shape(x.shape[0], ws[0].bits, ws[0].codebook, config)
  xf = x_fragments(x.astype(jnp.float16), s.codebook)
  chain = jax.jit(lambda xf, ts: [_mosaic_inner(xf, t, s) for t in ts])
  row["us"] = bench_util.median_us(chain, (xf, [w.trellis for w in ws]), len(ws), iterations)
  if op:  # what the model calls: the kernel plus XLA's rotations and mul1 affine around it
    full = jax.jit(lambda x, ws: [exl3_matmul(x, w, config=config) for w in ws])
    row["op_us"] = bench_util.median_us(full, (x, ws), len(ws), iterations)
  return row


def bench_shape(k, n, bits_list, ms, copies, iterations, codebook, configs, op_bits):
  """The kernel on `copies` weight sets (more than L2 holds) against XLA's bf16 dot."""
  rows = []
  dense_list = bench_util.dense_weights(k, n, copies)
  xs = {m: jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16) for m in ms}
  xla_us = {m: bench_util.dot_us(xs[m], dense_list, iterations) for m in ms}
  del dense_list
  for bits in bits_list:
    ws = [random_weight(jax.random.key(bits * 8 + c), k, n, bits, codebook) for c in range(copies)]
    for m in ms:
      for config in configs or [default_config(m, k // TILE, n // TILE, bits, codebook)]:
        row = dict(m=m, k=k, n=n, bits=bits, config=config, xla_us=xla_us[m])
        try:
          row |= _bench_kernel(xs[m], ws, config, iterations, bits in op_bits)
          row["tbs"] = k * n * bits / 8 / row["us"] / 1e6
        except Exception as e:  # noqa: BLE001 -- report the failure in the table and keep going
          row["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
          print(f"FAILED {row}: {row['error']}", file=sys.stderr)
        rows.append(row)
        print(_table_row(row), flush=True)
    del ws
  return rows


TABLE_HEAD = (
  "| K bits | M | in x out | tiles_n/tiles_k/stages/split_k | kernel us | TB/s | % of 4.24 "
  "| op us | XLA bf16 us | XLA / kernel | compile s | rel_err |\n"
  "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def _table_row(r: dict) -> str:
  c = r["config"]
  cells = [str(r["bits"]), str(r["m"]), f"{r['k']}x{r['n']}"]
  cells.append(f"{c.tiles_n}/{c.tiles_k}/{c.max_concurrent_steps}/{c.split_k}")
  if "error" in r:
    return "| " + " | ".join(cells + ["FAILED"]) + " |||||||"
  cells += [f"{r['us']:.1f}", f"{r['tbs']:.2f}", f"{100 * r['tbs'] / COPY_CEILING_TBS:.0f}%"]
  cells += [f"{r.get('op_us', math.nan):.1f}", f"{r['xla_us']:.1f}", f"{r['xla_us'] / r['us']:.2f}"]
  cells += [f"{r['compile_s']:.1f}", f"{r['rel_err']:.1e}"]
  return "| " + " | ".join(cells) + " |"


def _check_errors(x, xh, w: EXL3Weight, config) -> tuple[bool, str]:
  inner = bench_util.rel_err(inner_matmul(xh, w, config), inner_reference(xh, w))
  full = bench_util.rel_err(exl3_matmul(x, w, config=config), reference(x, w))
  return inner < 1e-3 and full < 1e-2, f"inner {inner:.1e} full {full:.1e}"


def check(ms, bits_list, codebooks, k: int = 1024, n: int = 896) -> bool:
  """The kernel against the references on the GPU, default config and a clamped split-K one."""
  ok = True
  for config in (None, TuningConfig(5, 8, 2, split_k=2)):  # 56 n-tiles: the last CTA clamps
    for codebook in codebooks:
      for bits in bits_list:
        for m in ms:
          w = random_weight(jax.random.key(bits * 31 + m), k, n, bits, codebook, bias=m % 2 == 1)
          x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
          xh = jax.random.normal(jax.random.key(m + 7), (m, k), jnp.float32)
          ok &= bench_util.check_case(
            f"check {codebook} K={bits} M={m} {config}",
            functools.partial(_check_errors, x, xh, w, config),
          )
  print(f"check {'passed' if ok else 'FAILED'}", flush=True)
  return ok


def main(
  *,
  mode: str = "all",
  check_ms=(1, 9, 16),
  check_bits=(1, 2, 4, 5, 8),
  check_codebooks=("mul1", "3inst", "mcg"),
  shapes=((8192, 28672),),
  bits=(2, 3, 4, 5, 6, 7, 8),
  ms=(1, 4, 8, 16),
  codebook: str = "mul1",
  op_bits=(4,),
  copies: int = 4,
  iterations: int = 5,
  tiles_n=(),
  tiles_k=(16,),
  stages=(4,),
  split_k=(1,),
) -> None:
  """The GPU check (exits 1 if it fails) and/or the benchmark (mode check, bench or all) over
  shapes (in, out), K bits and the configs tiles_n x tiles_k x stages x split_k (the heuristic's
  where tiles_n is empty); the whole op is timed too for K in op_bits. Run by
  experiments/bench_kernel.py --kernel=exl3."""
  if mode in ("check", "all") and not check(list(check_ms), list(check_bits), check_codebooks):
    sys.exit(1)
  if mode == "check":
    return
  configs = bench_util.config_sweep(TuningConfig, tiles_n, tiles_k, stages, split_k)
  print(TABLE_HEAD, flush=True)
  rows = []
  for k, n in shapes:
    rows += bench_shape(
      k, n, list(bits), list(ms), copies, iterations, Codebook(codebook), configs, list(op_bits)
    )
  print("\n" + TABLE_HEAD)
  print("\n".join(_table_row(r) for r in rows))
