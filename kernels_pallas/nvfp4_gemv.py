"""W4A16 NVFP4 GEMV / skinny GEMM for Hopper: x [M, K] bf16 @ W (K, N) -> [M, N] bf16, M = 1..16.

Mosaic GPU (`plgpu.kernel` + `plgpu.emit_pipeline`), the per-step arithmetic as PTX through
`plgpu.inline_mgpu` (`mma.sync`, `lop3`, `prmt`); the machinery is kernels_pallas/gemv_common.py.
One CTA = one warpgroup owning `tile_n` = 16 R rows of the packed weight [N, K/2] (layout:
docs/design.md, "Quantized weights"). K streams through TMA in steps of 256: codes [tile_n, 128 B]
and x [M, 256] (both 128B-swizzled), E4M3 scales [tile_n, 16 B]. Warp w takes 64 of the 256 k for
all R row blocks, so any N balances over the SMs and each x value is read by one warp. x and W
enter as free reshapes: one launch (plus XLA's sum of f32 partials when split_k > 1).

mma.sync, not wgmma: the cheap decode of a 32-bit word of 8 nibbles yields bf16 pairs (k, k + 4);
wgmma wants x in SMEM in K order (a permuting XLA op per call), mma.sync takes x from registers, so
each lane pairs its x fragment with 4 `prmt` per 8 values. M <= 16 is far under mma.sync's rate.

Decode (Marlin's trick, bf16 flavour): shifts and masks of the word put a nibble's sign at bit 15
and its E2M1 bits at [8:6], which as bf16 is E2M1(code) * 2^-126; one `mul.bf16x2` by the block
scale * 2^118 gives code * scale / 256 exactly; the epilogue applies 256 * the global scale. 15
integer ops per word in the checkpoint's bit order, 11 in the kernel's (`NVFP4Weight.in_order`,
specdec.quant.nvfp4.PAIR_SHIFTS); `decode_ptx` writes either. The integer pipe is the bound.

Testing without a GPU: `emulate()` runs the kernel's own `_step` and epilogue on numpy lanes;
`bank_conflicts()` checks the SMEM reads from the kernel's formulas (codes and scales conflict-
free, x 2-way). The Pallas GPU interpreter cannot run `inline_mgpu` PTX; lowering for cuda works
on a CPU-only jaxlib. Figures, tried variants and the bars: docs/benchmarks.md ("Kernel notes
moved from the code", and its NVFP4 sections).
"""

import dataclasses
import functools
import itertools
import math
from typing import ClassVar

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from kernels_pallas import bench_util
from kernels_pallas import gemv_common as gemv
from kernels_pallas.h200 import COPY_CEILING_TBS, NUM_SMS
from specdec.quant.nvfp4 import GROUP, PAIR_SHIFTS, BitOrder, NVFP4Weight, random_weight

TILE_K = 256  # K per pipeline step: one 128-byte swizzle line of packed codes per weight row
BLOCK_ROWS = gemv.BLOCK_ROWS
M_MAX = 16
# A CTA's fixed cost (launch, pipeline fill and drain) in weight rows of one K pass: without it,
# rows alone rank 5120x34816 as 2176 CTAs of 16 (17 per SM, 272 rows) ahead of 363 CTAs of 96
# (3 per SM, 288 rows), which measured slower (docs/benchmarks.md). With the charge: 408 vs 312.
CTA_ROWS = 8
WEIGHT_SCALE_SHIFT = 118  # block scales enter bf16 as scale * 2^118; the products are w / 256
OUT_SCALE = 2.0 ** (126 - WEIGHT_SCALE_SHIFT)


def _shifted(lines: list[str], reg: str, left: int) -> str:
  """The word $4 shifted left by `left` (negative: right) into `reg`; $4 itself for 0."""
  if not left:
    return "$4"
  lines.append(f"shl.b32 {reg}, $4, {left};" if left > 0 else f"shr.u32 {reg}, $4, {-left};")
  return reg


@functools.cache
def decode_ptx(order: BitOrder) -> str:
  """One word of 8 codes in bit order `order` -> 4 bf16x2 registers $0..$3 (codes p and p + 4, each
  E2M1 * 2^-126 times the splat $5; $4 is the word). Written from nvfp4.PAIR_SHIFTS: a pair whose
  sign and magnitude need the same shift is one mask, others mask the magnitudes and merge the
  signs with one lop3 ((a & c) | b = 0xEC)."""
  lines = ["{", ".reg .b32 a, b;"]
  for p, (sign, mag) in enumerate(PAIR_SHIFTS[order]):
    if sign == mag:
      lines.append(f"and.b32 a, {_shifted(lines, 'a', sign)}, 0x81C081C0;")
    else:
      lines.append(f"and.b32 b, {_shifted(lines, 'b', mag)}, 0x01C001C0;")
      lines.append(f"lop3.b32 a, {_shifted(lines, 'a', sign)}, b, 0x80008000, 0xEC;")
    lines.append(f"mul.rn.bf16x2 ${p}, a, $5;")
  return "\n".join([*lines, "}"])


# Two E4M3 scales (rows g and g + 8, low and high byte) -> two bf16x2 splats of scale * 2^118.
SCALE_PTX = """{
.reg .b16 lo, hi, h0, h1;
.reg .b32 p;
.reg .f32 f;
mov.b32 {lo, hi}, $2;
cvt.rn.f16x2.e4m3x2 p, lo;
mov.b32 {h0, h1}, p;
cvt.f32.f16 f, h0;
mul.f32 f, f, 0f7A800000;
cvt.rn.bf16x2.f32 $0, f, f;
cvt.f32.f16 f, h1;
mul.f32 f, f, 0f7A800000;
cvt.rn.bf16x2.f32 $1, f, f;
}"""


@dataclasses.dataclass(frozen=True)
class TuningConfig:
  tile_n: int = 112  # output features per CTA, a multiple of 16 (16 per mma row block)
  max_concurrent_steps: int = 4  # TMA pipeline depth (K steps in flight)
  split_k: int = 1  # CTAs along K; > 1 writes f32 partials that XLA sums
  # 128-byte code lines per row and pipeline step, one TMA copy each: a step covers lines x k_step
  # k, so the per-step waits and pipeline bookkeeping are paid once per `lines` lines.
  lines: int = 1
  k_step: ClassVar[int] = TILE_K  # k per code line (fp8_gemv's subclass: 128)

  def check(self, m: int, k: int, n: int) -> None:
    if not 1 <= m <= M_MAX:
      raise ValueError(f"{m=} must be in [1, {M_MAX}]")
    if self.tile_n % BLOCK_ROWS or not BLOCK_ROWS <= self.tile_n <= min(n, 256):
      raise ValueError(f"tile_n={self.tile_n} must be a multiple of 16 in [16, min({n=}, 256)]")
    if self.lines < 1 or k % (self.k_step * self.lines * self.split_k):
      raise ValueError(
        f"{k=} must be divisible by {self.k_step} * lines={self.lines} * split_k={self.split_k}"
      )


def _per_sm_rows(n: int, tile_n: int, split_k: int, num_sms: int) -> float:
  """Rows x K share of the busiest SM, each CTA charged CTA_ROWS more: whole CTAs land on SMs, and
  time scales with this."""
  ctas = math.ceil(n / tile_n) * split_k
  return math.ceil(ctas / num_sms) * (tile_n / split_k + CTA_ROWS)


def default_config(m: int, k: int, n: int, num_sms: int = NUM_SMS) -> TuningConfig:
  """The row blocks per CTA (1..8) that leave the busiest SM least work (`_per_sm_rows`), larger
  on ties; split K (powers of 2) only while it lowers that. A plan that leaves at most one CTA per
  SM is then split 4 (or 2) ways along K, keeping >= 4 steps per CTA: a lone CTA cannot hide its
  own TMA latency (splitting two CTAs per SM measured slower). An unsplit plan of at most 4 row
  blocks per CTA streams two code lines per step through two stages (`lines`): with few rows a
  step's fixed waits are a larger share; larger tiles gained nothing. Figures: docs/benchmarks.md.
  """
  del m
  best = None
  for split in (1, 2, 4, 8):
    if k % (TILE_K * split) or (split > 1 and math.ceil(n / 16) >= num_sms):
      continue
    for r in range(8, 0, -1):
      if 16 * r > n:
        continue
      cost = _per_sm_rows(n, 16 * r, split, num_sms) * (1 + 0.05 * (split > 1))
      if best is None or cost < best[0] - 1e-9:
        best = (cost, TuningConfig(tile_n=16 * r, split_k=split))
  if best is None:
    raise ValueError(f"no kernel plan fits K={k}, N={n}: K must be a multiple of {TILE_K}, N >= 16")
  config = best[1]
  if config.split_k == 1 and math.ceil(n / config.tile_n) <= num_sms:
    for split in (4, 2):
      if k % (TILE_K * split) == 0 and k // (TILE_K * split) >= 4:
        return dataclasses.replace(config, split_k=split)
  if config.split_k == 1 and config.tile_n <= 4 * BLOCK_ROWS and k % (2 * TILE_K) == 0:
    return dataclasses.replace(config, lines=2, max_concurrent_steps=2)
  return config


# ------------------------------------------------------------------------------------------------
# The per-step algorithm, written once for the emitter and the numpy emulator.


def s_offset(row, chunk, half):
  return row * 16 + (chunk << 1) + half


def x_offset(n, chunk, half, u):
  return n * 512 + (chunk << 6) + (half << 5) + (u << 4)


def _step(ops, nb: int, nt: int, m: int, line_bufs, acc, order: BitOrder):
  """One pipeline step: for each (codes, scales, x) buffer triple of `line_bufs` (256 k each, own
  SMEM buffers, so every line has the one-line layout and its bank behaviour) this warp's quarter
  of its k; `acc[b, j]` are 4 f32 C-fragment values for row block b (rows 16 b + g, + 8) and token
  tile j. The slot is released after the last line's reads."""
  for line, (w_buf, s_buf, x_buf) in enumerate(line_bufs):
    acc = _line(ops, nb, nt, m, w_buf, s_buf, x_buf, acc, order, line == len(line_bufs) - 1)
  return acc


def _line(ops, nb, nt, m, w_buf, s_buf, x_buf, acc, order: BitOrder, last: bool):
  warp, g, q = gemv.lanes(ops.tid)
  chunk, half = gemv.k_chunk(warp, q)
  words, sbytes = {}, {}
  for b in range(nb):
    for i in range(2):
      row = g + (BLOCK_ROWS * b + 8 * i)
      words[b, i] = ops.load(w_buf, gemv.w_offset(row, chunk, half), 2, swizzled=True)
      sbytes[b, i] = ops.load_u8(s_buf, s_offset(row, chunk, half))  # the lane's one group
  xs = {}
  for j in range(nt):
    n = ops.min(g + 8 * j, m - 1)  # padded tokens repeat the last one; their columns are dropped
    for u in range(2):
      x0, x1, x2, x3 = ops.load(x_buf, x_offset(n, chunk, half, u), 4, swizzled=True)
      xs[j, u] = (
        ops.prmt(x0, x2, gemv.PAIR_LO),
        ops.prmt(x0, x2, gemv.PAIR_HI),
        ops.prmt(x1, x3, gemv.PAIR_LO),
        ops.prmt(x1, x3, gemv.PAIR_HI),
      )
  if last:
    ops.release()  # every SMEM read of this slot is done; the pipeline may refill it
  for b in range(nb):
    splats = ops.scale_splats(sbytes[b, 0] | (sbytes[b, 1] << 8))
    for u in range(2):
      d0, d1 = (ops.decode(words[b, i][u], splats[i], order) for i in range(2))
      for h in range(2):
        a = (d0[2 * h], d1[2 * h], d0[2 * h + 1], d1[2 * h + 1])
        for j in range(nt):
          acc[b, j] = ops.mma(a, (xs[j, u][2 * h], xs[j, u][2 * h + 1]), acc[b, j])
  return acc


# ------------------------------------------------------------------------------------------------
# Numpy model and MLIR emitter: gemv_common's, with the NVFP4 decode and scales.


def _shift_np(q: np.ndarray, left: int) -> np.ndarray:
  return q << np.uint32(left) if left >= 0 else q >> np.uint32(-left)


def decode_word_np(word, splat, order: BitOrder = "checkpoint") -> list[np.ndarray]:
  """decode_ptx(order) on uint32 arrays: 4 bf16x2 words (low half = code p, high = p + 4)."""
  q = np.asarray(word, np.uint32)
  s = np.asarray(splat, np.uint32)
  out = []
  for sign, mag in PAIR_SHIFTS[order]:
    bits = (_shift_np(q, sign) & np.uint32(0x80008000)) | (
      _shift_np(q, mag) & np.uint32(0x01C001C0)
    )
    halves = []
    for sh in (0, 16):
      prod = gemv.bf16_bits_to_f32(
        (bits >> np.uint32(sh)) & np.uint32(0xFFFF)
      ) * gemv.bf16_bits_to_f32((s >> np.uint32(sh)) & np.uint32(0xFFFF))
      halves.append(gemv.f32_to_bf16_bits(prod))
    out.append(halves[0] | (halves[1] << np.uint32(16)))
  return out


def scale_splats_np(two_bytes) -> list[np.ndarray]:
  """SCALE_PTX: E4M3 bytes 0 and 1 -> two bf16x2 splats of scale * 2^118."""
  w = np.asarray(two_bytes, np.uint32)
  out = []
  for b in range(2):
    byte = ((w >> np.uint32(8 * b)) & np.uint32(0xFF)).astype(np.uint8)
    val = byte.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.float32(
      2.0**WEIGHT_SCALE_SHIFT
    )
    bits = gemv.f32_to_bf16_bits(val)
    out.append(bits | (bits << np.uint32(16)))
  return out


class _NumpyOps(gemv.NumpyOps):
  def scale_splats(self, two_bytes):
    return scale_splats_np(two_bytes)

  def decode(self, word, splat, order):
    return decode_word_np(word, splat, order)

  def out_factor(self, g_ref, row, divides):
    g = np.asarray(g_ref, np.float32)[row]
    return np.float32(OUT_SCALE) / g if divides else np.float32(OUT_SCALE) * g


class _MlirOps(gemv.MlirOps):
  def scale_splats(self, two_bytes):
    return gemv.mlir()[-1].inline_ptx(SCALE_PTX, two_bytes.v, result_types=[self.i32] * 2)

  def decode(self, word, splat, order):
    return gemv.mlir()[-1].inline_ptx(decode_ptx(order), word, splat, result_types=[self.i32] * 4)

  def out_factor(self, g_ref, row, divides):
    ir, arith, _, memref, *_ = gemv.mlir()
    g = memref.load(g_ref, [self.index(row)])
    k = arith.constant(self.f32, ir.FloatAttr.get(self.f32, OUT_SCALE))
    return arith.divf(k, g) if divides else arith.mulf(k, g)


def emulate(x_MK, w: NVFP4Weight, config: TuningConfig | None = None) -> np.ndarray:
  """The kernel's exact data movement and arithmetic on numpy; returns f32 [M, N] (pre-bf16).

  Slot i of each pipeline buffer sits at i * slot bytes from a 1024-aligned allocation, as in
  Pallas, so x slots of odd M exercise the swizzle on 512-aligned addresses.
  """
  x_MK = np.asarray(x_MK)
  (m, k), n = x_MK.shape, w.shape[1]
  config, nb, nt = gemv.checked_plan(config, default_config, m, k, n)
  tn, L = config.tile_n, config.lines
  packed = np.asarray(w.packed_NP).reshape(n, k // TILE_K // L, L, TILE_K // 2)
  scales = np.asarray(w.scales_NG).view(np.uint8)
  scales = scales.reshape(n, k // TILE_K // L, L, TILE_K // GROUP)
  x = np.asarray(x_MK.astype(ml_dtypes.bfloat16)).reshape(m, k // TILE_K // L, L, TILE_K)
  g_N = np.asarray(w.global_scale_N, np.float32)
  ops = _NumpyOps()
  out = np.zeros((config.split_k, m, n), np.float32)
  steps = k // TILE_K // L // config.split_k
  stages = min(config.max_concurrent_steps, steps)
  for blk in range(math.ceil(n / tn)):
    rows = slice(gemv.row_start(blk, n, tn), gemv.row_start(blk, n, tn) + tn)
    for split in range(config.split_k):
      acc = {
        (b, j): [np.zeros(128, np.float32) for _ in range(4)] for b in range(nb) for j in range(nt)
      }
      for step in range(split * steps, (split + 1) * steps):
        slot = (step - split * steps) % stages
        line_bufs = [
          (
            gemv.SmemImage.in_slot(packed[rows, step, j], slot, swizzled=True),
            gemv.SmemImage.in_slot(scales[rows, step, j], slot, swizzled=False),
            gemv.SmemImage.in_slot(x[:, step, j], slot, swizzled=True),
          )
          for j in range(L)
        ]
        acc = _step(ops, nb, nt, m, line_bufs, acc, w.bit_order)
      red = np.full((4, tn, 8 * nt), np.nan, np.float32)
      gemv.epilogue(ops, nb, nt, m, acc, red, g_N[rows], out[split][:, rows], w.global_divides)
  return out.sum(0)


def bank_conflicts(config: TuningConfig, m: int, slot_base: int = 0) -> dict[str, int]:
  """Extra SMEM wavefronts per step over all warps' loads, by buffer (0 = conflict-free)."""
  tid = np.arange(128, dtype=np.int64)
  warp, g, q = gemv.lanes(tid)
  chunk, half = gemv.k_chunk(warp, q)
  line0 = (slot_base >> 7) & 7

  wavefronts = gemv.extra_wavefronts
  out = {"w": 0, "s": 0, "x": 0}
  for b in range(config.tile_n // BLOCK_ROWS):
    for i in range(2):
      row = g + (BLOCK_ROWS * b + 8 * i)
      out["w"] += wavefronts(gemv.swizzle(gemv.w_offset(row, chunk, half), line0), 8)
      out["s"] += wavefronts(s_offset(row, chunk, half), 1)
  for j in range(1 if m <= 8 else 2):
    n = np.minimum(g + 8 * j, m - 1)
    for u in range(2):
      out["x"] += wavefronts(gemv.swizzle(x_offset(n, chunk, half, u), line0), 16)
  return out


# ------------------------------------------------------------------------------------------------
# The kernel.


@functools.partial(jax.jit, static_argnames=("config",))
def nvfp4_matmul(x_MK: jax.Array, w: NVFP4Weight, *, config: TuningConfig | None = None):
  """x [M, K] @ w (K, N) -> bf16 [M, N] through the kernel (`default_config`'s plan if config is
  None); a config that does not fit the shape raises ValueError. When the model runs it:
  specdec.ops.qmatmul.matmul."""
  (m, k), n = x_MK.shape, w.shape[1]
  config, nb, nt = gemv.checked_plan(config, default_config, m, k, n)
  tn, splits, L = config.tile_n, config.split_k, config.lines
  steps = k // TILE_K // L // splits
  acc_shape = (64 * nb, 8 * nt)
  acc_type = plgpu.ShapeDtypeStruct(acc_shape, jnp.float32, layout=plgpu.Layout.WGMMA)

  @plgpu.inline_mgpu(
    arg_types=(
      *(plgpu.RefType(gemv.SWIZZLED), plgpu.RefType(), plgpu.RefType(gemv.SWIZZLED)) * L,
      plgpu.Layout.WGMMA,
    ),
    return_type=acc_type,
  )
  def step(ctx, *refs):
    del ctx
    *line_refs, acc_fa = refs
    ops = _MlirOps()
    line_bufs = [
      # Scales are never swizzled, so their slot size does not matter.
      (ops.smem(w_ref, tn * TILE_K // 2), ops.smem(s_ref, 1024), ops.smem(x_ref, m * TILE_K * 2))
      for w_ref, s_ref, x_ref in zip(*[iter(line_refs)] * 3, strict=True)
    ]
    acc = _step(ops, nb, nt, m, line_bufs, gemv.acc_unpack(acc_fa, nb, nt), w.bit_order)
    return gemv.acc_pack(acc, acc_fa, nb, nt)

  @plgpu.inline_mgpu(
    arg_types=(plgpu.Layout.WGMMA, plgpu.RefType(), plgpu.RefType(), plgpu.RefType())
  )
  def epilogue(ctx, acc_fa, red_ref, g_ref, o_ref):
    del ctx
    ops = _MlirOps()
    acc = gemv.acc_unpack(acc_fa, nb, nt)
    gemv.epilogue(ops, nb, nt, m, acc, red_ref, g_ref, o_ref, w.global_divides)

  def kernel(x_gmem, w_gmem, s_gmem, g_gmem, o_gmem):
    rows = pl.ds(jnp.minimum(jax.lax.axis_index("n") * tn, n - tn), tn)
    k0 = jax.lax.axis_index("k") * steps
    specs = []
    for j in range(L):  # line j of step i is 256-k line (k0 + i) L + j
      line = lambda i, j=j: (0, (k0 + i) * L + j, 0)  # noqa: E731
      specs += [
        plgpu.BlockSpec((tn, 1, TILE_K // 2), line, transforms=gemv.SWIZZLED),
        plgpu.BlockSpec((tn, 1, TILE_K // GROUP), line),
        plgpu.BlockSpec((m, TILE_K // 64, 64), line, transforms=gemv.SWIZZLED),
      ]
    pipeline = gemv.acc_pipeline(step, specs, steps, config.max_concurrent_steps, acc_shape)
    acc = pipeline(*(w_gmem.at[rows], s_gmem.at[rows], x_gmem) * L)
    out = o_gmem.at[:, rows] if splits == 1 else o_gmem.at[jax.lax.axis_index("k"), :, rows]
    # The pipeline's buffers are free again here, so the reduction scratch reuses their SMEM.
    pl.run_scoped(
      lambda red: epilogue(acc, red, g_gmem.at[rows], out),
      plgpu.SMEM((4, tn, 8 * nt), jnp.float32),
    )

  call = gemv.launch(kernel, gemv.gemv_out_type(m, n, splits), math.ceil(n / tn), splits)
  # Row-major reshapes: free in XLA, and they give TMA one 128-byte line per block row.
  out = call(
    x_MK.astype(jnp.bfloat16).reshape(m, k // 64, 64),
    w.packed_NP.reshape(n, k // TILE_K, TILE_K // 2),
    w.scales_NG.reshape(n, k // TILE_K, TILE_K // GROUP),
    w.global_scale_N.astype(jnp.float32),
  )
  return out if splits == 1 else out.sum(0).astype(jnp.bfloat16)


def check_shape(m: int, w: NVFP4Weight) -> None:
  """Raises ValueError unless the kernel takes x [m, K] @ w: an unbatched weight and a default
  config whose check passes (what specdec.ops.qmatmul asks before it picks the kernel)."""
  if w.packed_NP.ndim != 2:
    raise ValueError(f"the NVFP4 kernel takes one weight, got packed_NP {w.packed_NP.shape}")
  k, n = w.shape
  default_config(m, k, n).check(m, k, n)


def reference(x_MK: jax.Array, w) -> jax.Array:
  """Plain jnp: dequantize to f32, f32 matmul, bf16 result (any quantized weight type)."""
  w_KN = w.dequantize(jnp.float32)
  y = jnp.dot(x_MK.astype(jnp.float32), w_KN, precision=jax.lax.Precision.HIGHEST)
  return y.astype(jnp.bfloat16)


# ------------------------------------------------------------------------------------------------
# Benchmark and GPU check.


def bench_shape(
  k: int, n: int, ms, copies: int, iterations: int, configs, orders=("kernel",)
) -> list[dict]:
  """Times the kernel and XLA's bf16 dot on `copies` weight sets (more than L2 holds), for each
  config and bit order of the codes."""
  rows = []
  key = jax.random.key(k * 131 + n)
  ws = random_weight(key, k, n, copies)
  by_order = {
    order: [jax.tree.map(lambda a, c=c: a[c], ws).in_order(order) for c in range(copies)]
    for order in orders
  }
  dense_list = bench_util.dense_weights(k, n, copies)
  q_bytes = k * n // 2 + k * n // GROUP
  for m in ms:
    x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
    ref = reference(x, by_order[orders[0]][0])
    t_xla = bench_util.dot_us(x, dense_list, iterations)
    for config, order in itertools.product(configs or [default_config(m, k, n)], orders):
      row = dict(m=m, k=k, n=n, config=config, order=order, xla_us=t_xla)
      row["xla_tbs"] = 2 * k * n / t_xla / 1e6
      matmul = functools.partial(nvfp4_matmul, config=config)
      label = f"m={m} k={k} n={n} {config} {order}"
      row |= bench_util.time_kernel(label, matmul, x, by_order[order], ref, iterations)
      if "us" in row:
        row["tbs"] = q_bytes / row["us"] / 1e6
      rows.append(row)
      print(_table_row(row), flush=True)
  return rows


TABLE_HEAD = (
  "| M | K x N | tile_n/stages/split_k/lines/order | us | TB/s | % of 4.24 | rel_err | compile s "
  "| XLA bf16 us (TB/s) | XLA time / kernel time |\n"
  "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
)


def _table_row(r: dict) -> str:
  c = r["config"]
  cells = [str(r["m"]), f"{r['k']}x{r['n']}"]
  cells.append(f"{c.tile_n}/{c.max_concurrent_steps}/{c.split_k}/{c.lines}/{r['order']}")
  if "error" in r:
    cells += ["FAILED"] + [""] * 4
  else:
    cells += [f"{r['us']:.1f}", f"{r['tbs']:.2f}", f"{100 * r['tbs'] / COPY_CEILING_TBS:.0f}%"]
    cells += [f"{r['rel_err']:.1e}", f"{r['compile_s']:.1f}"]
  cells.append(f"{r['xla_us']:.1f} ({r['xla_tbs']:.2f})")
  cells.append(f"{r['xla_us'] / r['us']:.2f}" if "us" in r else "")
  return "| " + " | ".join(cells) + " |"


def check(ms, k: int = 4096, n: int = 1024) -> bool:
  """The kernel against `reference` on the GPU, default config and a split-K one; prints errors."""
  ok = True
  cases = (
    (None, "kernel"),
    (TuningConfig(48, 2, 2), "checkpoint"),
    (TuningConfig(112, 2, 1, 2), "kernel"),
  )
  for config, order in cases:
    for m in ms:
      w = random_weight(jax.random.key(m), k, n)
      w = NVFP4Weight(w.packed_NP, w.scales_NG, w.global_scale_N, m % 2 == 0).in_order(order)
      x = jax.random.normal(jax.random.key(m + 1), (m, k), jnp.bfloat16)
      case = functools.partial(bench_util.check_against, nvfp4_matmul, reference, x, w, config)
      ok &= bench_util.check_case(f"check M={m} K={k} N={n} {config} {order}", case)
  return ok


def main(
  *,
  mode: str = "all",
  check_ms=(1, 3, 8, 16),
  shapes=((8192, 28672), (5120, 17408)),
  ms=(1, 4, 8, 16),
  copies: int = 4,
  iterations: int = 5,
  tile_n=(),
  stages=(4,),
  split_k=(1,),
  orders=("kernel",),
  lines=(1,),
) -> None:
  """The GPU check and/or the benchmark (mode check, bench or all) over shapes (K, N) and the
  configs tile_n x stages x split_k x lines (the heuristic's where tile_n is empty), with `copies`
  weight sets so that L2 holds none; run by experiments/bench_kernel.py --kernel=nvfp4."""
  if mode in ("check", "all"):
    check(list(check_ms))
  if mode == "check":
    return
  configs = bench_util.config_sweep(TuningConfig, tile_n, stages, split_k, lines)
  print(TABLE_HEAD, flush=True)
  rows = []
  for k, n in shapes:
    rows += bench_shape(k, n, list(ms), copies, iterations, configs, tuple(orders))
  print("\n" + TABLE_HEAD)
  print("\n".join(_table_row(r) for r in rows))
