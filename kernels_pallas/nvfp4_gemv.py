"""W4A16 NVFP4 GEMV / skinny GEMM for Hopper: x [M, K] bf16 @ W (K, N) -> [M, N] bf16, M = 1..16.

Backend: Mosaic GPU (`plgpu.kernel` + `plgpu.emit_pipeline`), with the per-step arithmetic written
through `plgpu.inline_mgpu` as PTX (`mma.sync`, `lop3`, `prmt`). Mosaic GPU did not block anything;
no Triton fallback exists.

Structure. One CTA = one warpgroup owning `tile_n` = 16 R output features (rows of the packed
weight). K streams through a TMA pipeline in steps of 256: per step the codes [tile_n, 128 B]
(128B-swizzled), the E4M3 scales [tile_n, 16 B] and x [M, 256] (128B-swizzled). Inside a step the
four warps split K, not rows: warp w takes 64 of the 256 k for all R row blocks, so R is free (the
grid is balanced for any N: 8192x28672 uses R = 7, 256 CTAs, 1.94 per SM), each x value is read
by one warp instead of four, and each warp keeps R x (M / 8) f32 mma accumulators that a short SMEM
reduction sums at the end. The last CTA's rows are clamped to end at N (rows done twice are
written twice with the same value). Output goes straight to [M, N] (or f32 partials for
split_k > 1, summed by XLA); x and W enter as free reshapes, so the op is one launch.

Why mma.sync and not wgmma. The cheap FP4 decode works on a 32-bit word of 8 nibbles and yields
bf16 pairs (k, k + 4), not (k, k + 1). With wgmma, B (x) must sit in SMEM in K order, so x would
need a permuting XLA op before every call (and the output a transpose after): two extra launches
of ~2 us on a ~40 us kernel. `mma.sync` takes B from registers, so each lane builds its x fragment
from the same physical k it decoded (4 `prmt` per 8 values); nothing is permuted outside. M <= 16
needs < 200 TFLOP/s, far under mma.sync's rate.

Decode (Marlin's trick, bf16 flavour). For a word q and pair p, in the checkpoint's bit order A = q
<< (12 - 4p) puts nibble p's sign at bit 15 and nibble p + 4's at bit 31; B = q << (6 - 4p) puts
their (e1 e0 m) bits at [8:6] and [24:22]. bf16 bits `(A & 0x80008000) | (B & 0x01C001C0)` are
exactly E2M1(code) * 2^-126 (e = 0 lands on the bf16 subnormals). One `mul.bf16x2` by the block
scale, pre-multiplied by 2^118 (E4M3 -> f16 by `cvt.e4m3x2`, then f32, then bf16), gives code *
scale / 256 exactly (<= 6 significant bits, in [2^-18, 10.5]); the epilogue multiplies by 256 *
global scale (or divides). 15 integer ops + 4 bf16x2 multiplies per 8 weights, no lookup table.
Weights in the kernel's bit order (`NVFP4Weight.in_order("kernel")`, done once at load on a GPU;
specdec.quant.nvfp4's PAIR_SHIFTS) need 11: two pairs are one shift and one mask. `decode_ptx`
writes either from the shift table, and the kernel takes the order the weight is in.

Measured on the H200 (2026-11-30, jax 0.11.2, CUPTI kernel time, median of 5 runs over 4 weight
copies so L2 holds none; `PYTHONPATH=. python3 -m kernels_pallas.nvfp4_gemv --mode bench`;
TB/s = (K N / 2 + K N / 16) bytes / time; XLA = its bf16 dot on a dense (K, N) weight):

  M   K x N        tile_n  us    TB/s  % of 4.24  XLA us (TB/s)  XLA/kernel  compile s
  1   8192x28672   112     41.2  3.20  76%        105.8 (4.44)   2.57        0.6
  4   8192x28672   112     42.1  3.14  74%        108.6 (4.32)   2.58        0.8
  8   8192x28672   112     41.2  3.20  76%        108.1 (4.34)   2.62        0.7
  16  8192x28672   112     46.5  2.84  67%        110.7 (4.24)   2.38        0.8
  1   5120x17408   48      19.6  2.56  60%         44.0 (4.05)   2.25        0.6
  16  5120x17408   48      22.4  2.23  53%         46.1 (3.86)   2.06        0.6

With the codes in the kernel's bit order (session 4, two processes): 8192x28672 M = 1 / 4 / 8 / 16
40.0-40.8 / 40.4-40.8 / 40.5-40.8 / 45.0-45.3 us (3.24-3.30 TB/s at M = 1, 2.64-2.72x XLA);
5120x17408 18.0-18.2 / 18.0-18.2 / 18.1-18.2 / 20.9-21.2 us (2.75-2.79 TB/s at M = 1).

The issue's bars (>= 3.4 TB/s, >= 3x XLA's time) are not met; compile (<= 20 s) is. Note the two
speed bars are nearly one: XLA's dot runs at 4.2-4.4 TB/s of kernel time, so 3x its time needs
3.7 TB/s of NVFP4 bytes, 88% of the copy ceiling. This kernel's own pipeline with an empty body
(same grid, specs and plans; nothing decoded) takes 32.0-32.9 us on 8192x28672 and 13.2 us on
5120x17408, against budgets of 35.9 and 14.2 us for 3x XLA (session 8, docs/benchmarks.md): all
the arithmetic would have to hide under the byte stream but for 3.9 and 1.0 us.

What bounds it. Not HBM: the first version (rows split over warps, 128-row CTAs, 224 of them)
ran 46.3 us on 8192x28672 at M = 1 and did not speed up with more pipeline stages (3, 4, 6, 8) or
more CTAs per SM (64-row CTAs: 51 us); its per-SM issue rate saturated near 0.5 instructions per
cycle, the rate of the 16-lane integer pipe, because the decode is ~15 integer ops per 8 weights.
At 3.4 TB/s that decode alone needs ~70% of the H200's integer throughput. So this version spends
no integer op the decode does not need (x is read and paired by one warp, not four) and balances
rows across SMs (busiest SM 224 rows instead of 256): 46.3 -> 41.2 us, and 30.2 -> 19.6 us on
5120x17408 (136 CTAs left 4 SMs doing twice the work). Measured and worse: a decode that shifted
q right by a byte once and then only left (44.5 us), 3 or 6 stages (42.2, 44.2 us), 96-row CTAs
on 5120x17408 (25.5 us). M > 8 doubles the mma and x work (two token tiles): 41 -> 46.5 us.

Nsight Compute on that version (8192x28672, M = 1, 2026-11-30, `--clock-control none`): 42.8 us at
1.79 GHz, 114 registers, 66.6 KB of SMEM per CTA (3 CTAs per SM fit, 1.94 exist), 7.45 warps per SM,
issue slots 60% busy (2.64 IPC), ALU pipe 55%; 737 SASS instructions per thread and step (28 words:
LOP3 230, IMAD 164 (ptxas already turns the left shifts into IMAD.SHL), HMUL2 112, SHF 59, LDS 30,
HMMA 28, scale conversions ~50). The kernel bit order removes 4 of ~26 instructions per word, for
2-8% (40.0-40.8 us): the rest is latency. Per issued instruction a warp then waits ~0.45 cycles on
fixed-latency results, ~0.44 on SMEM/mbarrier results, ~0.28 on a busy pipe, and fewer than two
warps per scheduler cannot cover it. More warps were measured not to help: smaller tiles (more CTAs
per SM; tile sweep in docs/benchmarks.md) cost as much per-warp work as they hide, and a
warp-specialized version (two compute warpgroups sharing each SMEM stage plus a TMA warpgroup,
`plgpu.emit_pipeline_warp_specialized`; correct on the GPU) ran slower: 46.3 us on 8192x28672 at
tile 128 (53.4 at 96, 56.5 at 64) and 24.9 us on 5120x17408 at tile 96. It was removed. A wider step
(`TuningConfig.lines` = 2: two 256-k code lines per pipeline step, each in its own buffers) halves
the per-step waits: 5-8% faster on 5120x17408 (48 rows per CTA; M = 1 18.4-18.6 -> 17.2-17.3 us,
2.90-2.92 TB/s), no change on 8192x28672 (112 rows; 39.9 vs 39.6-40.3 us), so `default_config`
uses it for tiles of at most 4 row blocks. What is left: fewer dependent instructions per word
(in the session-4 SASS the scale splat is 8 per row block and step, 5 of them conversions).

Bank conflicts. With the 128B swizzle (16-byte chunk c of a 128-byte line is stored at c ^ line%8)
the code reads (8 B per lane, chunks w and w + 4 of each row line) and scale reads are conflict-
free; x reads are at most 2-way. `bank_conflicts()` checks this from the kernel's own formulas.

Testing without a GPU. The per-step algorithm `_step` and the epilogue are written once against a
small ops interface; `_MlirOps` emits them, `_NumpyOps` runs them on numpy arrays of 128 thread
values (SMEM images built with the TMA swizzle, mma fragments gathered per warp). `emulate()` is
therefore a bit-faithful CPU model of the kernel. The Pallas GPU interpreter
(`plgpu.InterpretGPUParams`) cannot run this kernel: `inline_mgpu` emits PTX. Lowering works on a
CPU-only jaxlib (`jax.export` with platforms=["cuda"]); the CPU tests use that.
"""

import argparse
import contextlib
import dataclasses
import functools
import itertools
import math
import statistics
import sys
import time
from typing import ClassVar

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from specdec import xla_env
from specdec.ops.qmatmul import QuantizedWeight
from specdec.quant.nvfp4 import GROUP, PAIR_SHIFTS, BitOrder, NVFP4Weight

TILE_K = 256  # K per pipeline step: one 128-byte swizzle line of packed codes per weight row
BLOCK_ROWS = 16  # rows of one mma.sync A operand
M_MAX = 16
NUM_SMS = 132
# A CTA's fixed cost (launch, pipeline fill and drain) in weight rows of one K pass. Rows alone
# rank 5120x34816 as 2176 CTAs of 16 (17 per SM, 272 rows) ahead of 363 CTAs of 96 (3 per SM, 288
# rows); measured 42.0 vs 30.6 us (H200, M = 1, 2026-11-30). With the charge: 408 vs 312.
CTA_ROWS = 8
WEIGHT_SCALE_SHIFT = 118  # block scales enter bf16 as scale * 2^118; the products are w / 256
OUT_SCALE = 2.0 ** (126 - WEIGHT_SCALE_SHIFT)
COPY_CEILING_TBS = 4.24  # DESIGN.md section 9, device-to-device copy on the H200


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

MMA_PTX = (
  "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
  "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
)

# prmt selectors that pair x values (k, k + 4) from two words holding (k, k+1) and (k+4, k+5).
PAIR_LO, PAIR_HI = 0x5410, 0x7632


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
  own TMA latency.

  That last rule is measured (H200, 2026-11-30, M = 1, `--mode bench`, the f32 partial sum
  included): 12288x4096 as 128 CTAs of 32 rows 17.1 us, split 4 ways 13.7 us; 4096x4096 6.7 ->
  6.2 us; 4096x6144 (48 rows) 9.0 -> 8.6 us. Splitting 4096x24576 (256 CTAs, two per SM) in 2
  made it slower (21.3 -> 26.1 us), hence the one-CTA-per-SM condition.

  An unsplit plan of at most 4 row blocks per CTA streams two code lines per step through two
  stages (`lines`): with few rows a step's fixed waits are a larger share. Measured (same bench,
  two runs): 5120x17408 (48 rows) M = 1 / 8 / 16 18.4-18.6 / 18.9 / 21.2 -> 17.2-17.3 / 17.4 /
  20.3 us; 8192x28672 (112 rows) unchanged within noise (M = 1 39.6-40.3 either way, M = 16
  44.2-45.2 -> 44.8), so larger tiles keep one line.
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
  assert best is not None, (k, n)
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


def swizzle(offset, line0):
  """SMEM byte offset -> where the 128B-swizzling TMA put it (line0 = slot base address >> 7)."""
  return offset ^ ((((offset >> 7) + line0) & 7) << 4)


def _lanes(tid):
  lane = tid & 31
  return (tid >> 5) & 3, lane >> 2, lane & 3  # warp, row-in-block g, quad lane q


def _k_chunk(warp, q):
  """(16-byte chunk of the 128-byte row line, 8-byte half) of a lane: its 16 k of the step are
  32 chunk + 16 half + [0, 16). Warps take chunks w and w + 4 so 4 rows x 4 lanes of 8 bytes cover
  all 32 banks through the swizzle."""
  return warp + ((q >> 1) << 2), q & 1


def w_offset(row, chunk, half):
  return row * 128 + (chunk << 4) + (half << 3)


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
  warp, g, q = _lanes(ops.tid)
  chunk, half = _k_chunk(warp, q)
  words, sbytes = {}, {}
  for b in range(nb):
    for i in range(2):
      row = g + (BLOCK_ROWS * b + 8 * i)
      words[b, i] = ops.load(w_buf, w_offset(row, chunk, half), 2, swizzled=True)
      sbytes[b, i] = ops.load_u8(s_buf, s_offset(row, chunk, half))  # the lane's one group
  xs = {}
  for j in range(nt):
    n = ops.min(g + 8 * j, m - 1)  # padded tokens repeat the last one; their columns are dropped
    for u in range(2):
      x0, x1, x2, x3 = ops.load(x_buf, x_offset(n, chunk, half, u), 4, swizzled=True)
      xs[j, u] = (
        ops.prmt(x0, x2, PAIR_LO),
        ops.prmt(x0, x2, PAIR_HI),
        ops.prmt(x1, x3, PAIR_LO),
        ops.prmt(x1, x3, PAIR_HI),
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


def _epilogue(ops, nb: int, nt: int, m: int, acc, red, g_ref, o_ref, divides: bool):
  """Sums the four warps' partials through SMEM; the warp w finishes row blocks b = w mod 4."""
  warp, g, q = _lanes(ops.tid)
  for b in range(nb):
    for j in range(nt):
      for i in range(2):
        for e in range(2):
          ops.red_store(
            red, warp, g + (BLOCK_ROWS * b + 8 * i), q * 2 + (8 * j + e), acc[b, j][2 * i + e]
          )
  ops.barrier()
  for b in range(nb):
    with ops.only_warp(b % 4):
      for i in range(2):
        row = g + (BLOCK_ROWS * b + 8 * i)
        factor = ops.out_factor(g_ref, row, divides)
        for j in range(nt):
          for e in range(2):
            col = q * 2 + (8 * j + e)
            total = ops.red_load(red, 0, row, col)
            for w in range(1, 4):
              total = ops.fadd(total, ops.red_load(red, w, row, col))
            ops.store_if_below(o_ref, col, row, ops.fmul(total, factor), m)


# ------------------------------------------------------------------------------------------------
# Numpy model of one warpgroup (arrays of 128 thread values).


def _bf16_bits_to_f32(bits) -> np.ndarray:
  return (np.asarray(bits, np.uint32) << 16).view(np.float32)


def _f32_to_bf16_bits(x) -> np.ndarray:
  return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)


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
      prod = _bf16_bits_to_f32((bits >> np.uint32(sh)) & np.uint32(0xFFFF)) * _bf16_bits_to_f32(
        (s >> np.uint32(sh)) & np.uint32(0xFFFF)
      )
      halves.append(_f32_to_bf16_bits(prod))
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
    bits = _f32_to_bf16_bits(val)
    out.append(bits | (bits << np.uint32(16)))
  return out


def prmt_np(a, b, sel: int) -> np.ndarray:
  pool = np.stack(
    [(np.asarray(x, np.uint32) >> np.uint32(8 * i)) & 0xFF for x in (a, b) for i in range(4)]
  )
  out = np.zeros_like(np.asarray(a, np.uint32))
  for i in range(4):
    out |= pool[(sel >> (4 * i)) & 7] << np.uint32(8 * i)
  return out


def _unpack_bf16x2(word) -> tuple[np.ndarray, np.ndarray]:
  w = np.asarray(word, np.uint32)
  return _bf16_bits_to_f32(w & np.uint32(0xFFFF)), _bf16_bits_to_f32(w >> np.uint32(16))


class _SmemImage:
  """One pipeline slot as TMA leaves it: logical bytes, swizzled by absolute address when asked."""

  def __init__(self, logical: np.ndarray, base: int, swizzled: bool):
    flat = np.ascontiguousarray(logical).view(np.uint8).reshape(-1)
    self.line0 = (base >> 7) & 7
    self.bytes = np.zeros_like(flat)
    idx = np.arange(flat.size)
    self.bytes[swizzle(idx, self.line0) if swizzled else idx] = flat


class _NumpyOps:
  def __init__(self):
    self.tid = np.arange(128, dtype=np.uint32)
    self.mask = np.ones(128, bool)

  def load(self, buf: _SmemImage, offset, n: int, swizzled: bool):
    offset = np.asarray(offset, np.int64)
    if swizzled:
      offset = swizzle(offset, buf.line0)
    assert np.all(offset % (4 * n) == 0), "misaligned vector load"
    raw = buf.bytes[offset[:, None] + np.arange(4 * n)]
    return list(np.ascontiguousarray(raw).view(np.uint32).T)

  def load_u8(self, buf: _SmemImage, offset):
    return buf.bytes[np.asarray(offset, np.int64)].astype(np.uint32)

  def min(self, a, b):
    return np.minimum(a, np.uint32(b))

  def prmt(self, a, b, sel):
    return prmt_np(a, b, sel)

  def release(self):
    pass

  def barrier(self):
    pass

  def scale_splats(self, two_bytes):
    return scale_splats_np(two_bytes)

  def decode(self, word, splat, order):
    return decode_word_np(word, splat, order)

  def mma(self, a, b, c):
    """m16n8k16 on fragments: a rows (g, g+8) x k (2q, 2q+8), b k (2q, 2q+8) x col g, c (g, 2q)."""
    lane = self.tid & 31
    g, q = lane >> 2, lane & 3
    out = [np.zeros(128, np.float32) for _ in range(4)]
    for w in range(4):
      sel = slice(32 * w, 32 * w + 32)
      A = np.zeros((16, 16), np.float64)
      B = np.zeros((16, 8), np.float64)
      C = np.zeros((16, 8), np.float64)
      gg, qq = g[sel], q[sel]
      for reg, (dr, dk) in zip(a, ((0, 0), (8, 0), (0, 8), (8, 8)), strict=True):
        lo, hi = _unpack_bf16x2(reg[sel])
        A[gg + dr, 2 * qq + dk] = lo
        A[gg + dr, 2 * qq + dk + 1] = hi
      for reg, dk in zip(b, (0, 8), strict=True):
        lo, hi = _unpack_bf16x2(reg[sel])
        B[2 * qq + dk, gg] = lo
        B[2 * qq + dk + 1, gg] = hi
      for idx, (dr, dc) in enumerate(((0, 0), (0, 1), (8, 0), (8, 1))):
        C[gg + dr, 2 * qq + dc] = c[idx][sel]
      D = (A @ B + C).astype(np.float32)
      for idx, (dr, dc) in enumerate(((0, 0), (0, 1), (8, 0), (8, 1))):
        out[idx][sel] = D[gg + dr, 2 * qq + dc]
    return out

  def red_store(self, red, warp, row, col, val):
    red[warp, row, col] = val

  def red_load(self, red, warp, row, col):
    return red[warp, row, col]

  @contextlib.contextmanager
  def only_warp(self, w: int):
    self.mask = (self.tid >> 5) == w
    yield
    self.mask = np.ones(128, bool)

  def out_factor(self, g_ref, row, divides):
    g = np.asarray(g_ref, np.float32)[row]
    return np.float32(OUT_SCALE) / g if divides else np.float32(OUT_SCALE) * g

  def fadd(self, a, b):
    return (np.asarray(a, np.float32) + b).astype(np.float32)

  def fmul(self, a, b):
    return (np.asarray(a, np.float32) * b).astype(np.float32)

  def store_if_below(self, o_ref, col, row, val, m):
    ok = (col < m) & self.mask
    o_ref[col[ok], row[ok]] = val[ok]


def checked_plan(config, default, m: int, k: int, n: int):
  """config (else default(m, k, n)) checked for the shape, with its row blocks per CTA and its
  token tiles of 8 (two above M = 8): the geometry every GEMV kernel here and its model share."""
  config = config or default(m, k, n)
  config.check(m, k, n)
  return config, config.tile_n // BLOCK_ROWS, 1 if m <= 8 else 2


def _row_start(blk: int, n: int, tile_n: int):
  """First row of a CTA; the last CTA is pulled back to end at N (its overlap is recomputed)."""
  return min(blk * tile_n, n - tile_n)


def emulate(x_MK, w: NVFP4Weight, config: TuningConfig | None = None) -> np.ndarray:
  """The kernel's exact data movement and arithmetic on numpy; returns f32 [M, N] (pre-bf16).

  Slot i of each pipeline buffer sits at i * slot bytes from a 1024-aligned allocation, as in
  Pallas, so x slots of odd M exercise the swizzle on 512-aligned addresses.
  """
  x_MK = np.asarray(x_MK)
  (m, k), n = x_MK.shape, w.shape[1]
  config, nb, nt = checked_plan(config, default_config, m, k, n)
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
    rows = slice(_row_start(blk, n, tn), _row_start(blk, n, tn) + tn)
    for split in range(config.split_k):
      acc = {
        (b, j): [np.zeros(128, np.float32) for _ in range(4)] for b in range(nb) for j in range(nt)
      }
      for step in range(split * steps, (split + 1) * steps):
        slot = (step - split * steps) % stages
        line_bufs = [
          (
            _SmemImage(packed[rows, step, j], slot * packed[rows, step, j].nbytes, swizzled=True),
            _SmemImage(scales[rows, step, j], slot * scales[rows, step, j].nbytes, swizzled=False),
            _SmemImage(x[:, step, j], slot * x[:, step, j].nbytes, swizzled=True),
          )
          for j in range(L)
        ]
        acc = _step(ops, nb, nt, m, line_bufs, acc, w.bit_order)
      red = np.full((4, tn, 8 * nt), np.nan, np.float32)
      _epilogue(ops, nb, nt, m, acc, red, g_N[rows], out[split][:, rows], w.global_divides)
  return out.sum(0)


def bank_conflicts(config: TuningConfig, m: int, slot_base: int = 0) -> dict[str, int]:
  """Extra SMEM wavefronts per step over all warps' loads, by buffer (0 = conflict-free)."""
  tid = np.arange(128, dtype=np.int64)
  warp, g, q = _lanes(tid)
  chunk, half = _k_chunk(warp, q)
  line0 = (slot_base >> 7) & 7

  def wavefronts(addr, nbytes):
    # A warp's 16-byte loads go in 4 phases of 8 lanes, 8-byte in 2 of 16, smaller in 1 (32 banks).
    lanes_per_phase = min(32, 128 // nbytes)
    extra = 0
    for w in range(4):
      a = addr[32 * w : 32 * w + 32]
      for p in range(0, 32, lanes_per_phase):
        words = {
          (int(x) // 4 + i) for x in a[p : p + lanes_per_phase] for i in range(max(1, nbytes // 4))
        }
        banks: dict[int, set[int]] = {}
        for word in words:
          banks.setdefault(word % 32, set()).add(word)
        extra += max(len(v) for v in banks.values()) - 1
    return extra

  out = {"w": 0, "s": 0, "x": 0}
  for b in range(config.tile_n // BLOCK_ROWS):
    for i in range(2):
      row = g + (BLOCK_ROWS * b + 8 * i)
      out["w"] += wavefronts(swizzle(w_offset(row, chunk, half), line0), 8)
      out["s"] += wavefronts(s_offset(row, chunk, half), 1)
  for j in range(1 if m <= 8 else 2):
    n = np.minimum(g + 8 * j, m - 1)
    for u in range(2):
      out["x"] += wavefronts(swizzle(x_offset(n, chunk, half, u), line0), 16)
  return out


# ------------------------------------------------------------------------------------------------
# MLIR emitter.


def _mlir():
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith, llvm, memref, scf, vector

  return ir, arith, llvm, memref, scf, vector, mgpu_utils


class _I32:
  """An i32 MLIR value with Python operators, so the address formulas above emit arith ops."""

  def __init__(self, v):
    self.v = v

  @staticmethod
  def _val(o):
    ir, arith = _mlir()[:2]
    if isinstance(o, _I32):
      return o.v
    i32 = ir.IntegerType.get_signless(32)
    return arith.constant(i32, ir.IntegerAttr.get(i32, int(o)))

  def _bin(self, op, o, swap=False):
    a, b = self._val(self), self._val(o)
    return _I32(op(b, a) if swap else op(a, b))

  def __add__(self, o):
    return self._bin(_mlir()[1].addi, o)

  def __radd__(self, o):
    return self._bin(_mlir()[1].addi, o, swap=True)

  def __mul__(self, o):
    return self._bin(_mlir()[1].muli, o)

  def __rmul__(self, o):
    return self._bin(_mlir()[1].muli, o, swap=True)

  def __and__(self, o):
    return self._bin(_mlir()[1].andi, o)

  def __or__(self, o):
    return self._bin(_mlir()[1].ori, o)

  def __xor__(self, o):
    return self._bin(_mlir()[1].xori, o)

  def __lshift__(self, o):
    return self._bin(_mlir()[1].shli, o)

  def __rshift__(self, o):
    return self._bin(_mlir()[1].shrui, o)


class _MlirOps:
  def __init__(self):
    ir, *_, mgpu_utils = _mlir()
    self.i32 = ir.IntegerType.get_signless(32)
    self.f32 = ir.F32Type.get()
    self.tid = _I32(mgpu_utils.thread_idx())

  def smem(self, ref, slot_bytes: int):
    """(base pointer, base line % 8). Pallas aligns SMEM allocations to 1024 bytes, so the line
    is a constant 0 when slots are 1024-byte multiples; x slots of odd M read it off the address."""
    ir, arith, llvm, *_, mgpu_utils = _mlir()
    ptr = mgpu_utils.memref_ptr(ref)
    if slot_bytes % 1024 == 0:
      return ptr, 0
    addr = arith.trunci(self.i32, llvm.ptrtoint(ir.IntegerType.get_signless(64), ptr))
    return ptr, (_I32(addr) >> 7) & 7

  def _ptr(self, buf, offset, swizzled):
    ir, *_, mgpu_utils = _mlir()
    ptr, line0 = buf
    if swizzled:
      offset = swizzle(offset, line0)
    return mgpu_utils.getelementptr(ptr, [offset.v], ir.IntegerType.get_signless(8))

  def load(self, buf, offset, n: int, swizzled: bool):
    ir, _, llvm, *_, vector, _ = _mlir()
    p = self._ptr(buf, offset, swizzled)
    vec = llvm.load(ir.VectorType.get((n,), self.i32), p, alignment=4 * n)
    return [
      vector.extract(vec, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([i]))
      for i in range(n)
    ]

  def load_u8(self, buf, offset):
    ir, arith, llvm, *_ = _mlir()
    byte = llvm.load(ir.IntegerType.get_signless(8), self._ptr(buf, offset, False), alignment=1)
    return _I32(arith.extui(self.i32, byte))

  def min(self, a, b):
    return _I32(_mlir()[1].minui(a.v, _I32._val(b)))

  def prmt(self, a, b, sel):
    mgpu_utils = _mlir()[-1]
    return mgpu_utils.inline_ptx(f"prmt.b32 $0, $1, $2, {sel:#x};", a, b, result_types=self.i32)

  def release(self):
    _mlir()[-1].warpgroup_barrier()

  def barrier(self):
    _mlir()[-1].warpgroup_barrier()

  def scale_splats(self, two_bytes):
    return _mlir()[-1].inline_ptx(SCALE_PTX, two_bytes.v, result_types=[self.i32] * 2)

  def decode(self, word, splat, order):
    return _mlir()[-1].inline_ptx(decode_ptx(order), word, splat, result_types=[self.i32] * 4)

  def mma(self, a, b, c):
    return list(_mlir()[-1].inline_ptx(MMA_PTX, *a, *b, *c, result_types=[self.f32] * 4))

  def _index(self, v):
    ir, arith, *_ = _mlir()
    return arith.index_cast(ir.IndexType.get(), _I32._val(v))

  def red_store(self, red, warp, row, col, val):
    _mlir()[3].store(val, red, [self._index(warp), self._index(row), self._index(col)])

  def red_load(self, red, warp, row, col):
    return _mlir()[3].load(red, [self._index(warp), self._index(row), self._index(col)])

  @contextlib.contextmanager
  def only_warp(self, w: int):
    ir, arith, _, _, scf, *_ = _mlir()
    warp = _lanes(self.tid)[0]
    if_op = scf.IfOp(arith.cmpi(arith.CmpIPredicate.eq, warp.v, _I32._val(w)))
    with ir.InsertionPoint(if_op.then_block):
      yield
      scf.yield_([])

  def out_factor(self, g_ref, row, divides):
    ir, arith, _, memref, *_ = _mlir()
    g = memref.load(g_ref, [self._index(row)])
    k = arith.constant(self.f32, ir.FloatAttr.get(self.f32, OUT_SCALE))
    return arith.divf(k, g) if divides else arith.mulf(k, g)

  def fadd(self, a, b):
    return _mlir()[1].addf(a, b)

  def fmul(self, a, b):
    return _mlir()[1].mulf(a, b)

  def store_if_below(self, o_ref, col, row, val, m):
    ir, arith, _, memref, scf, *_ = _mlir()
    elt = ir.MemRefType(o_ref.type).element_type
    if elt != self.f32:
      val = arith.truncf(elt, val)
    if_op = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ult, col.v, _I32._val(m)))
    with ir.InsertionPoint(if_op.then_block):
      memref.store(val, o_ref, [self._index(col), self._index(row)])
      scf.yield_([])


def _acc_unpack(fa, nb: int, nt: int):
  """The carried accumulator is a [64 nb, 8 nt] WGMMA-layout array only as a register container:
  register (b, j, i) holds this warp's partial C fragment (rows g + 8 i of block b, tokens j)."""
  ir, *_, vector, _ = _mlir()
  regs = fa.registers.reshape(nb, nt, 2)

  def el(v, e):
    return vector.extract(v, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([e]))

  return {
    (b, j): [el(regs[b, j, 0], 0), el(regs[b, j, 0], 1), el(regs[b, j, 1], 0), el(regs[b, j, 1], 1)]
    for b in range(nb)
    for j in range(nt)
  }


def _acc_pack(acc, like, nb: int, nt: int):
  import jax.experimental.mosaic.gpu as mgpu

  ir, *_, vector, _ = _mlir()
  v2 = ir.VectorType.get((2,), ir.F32Type.get())
  regs = np.empty((nb, nt, 2), dtype=object)
  for (b, j), c in acc.items():
    regs[b, j, 0] = vector.from_elements(v2, c[0:2])
    regs[b, j, 1] = vector.from_elements(v2, c[2:4])
  return mgpu.FragmentedArray(
    _registers=regs.reshape(like.registers.shape), _layout=like.layout, _is_signed=None
  )


# ------------------------------------------------------------------------------------------------
# The kernel.

_SWIZZLED = (plgpu.SwizzleTransform(128),)


def gemv_out_type(m: int, n: int, splits: int) -> jax.ShapeDtypeStruct:
  """[M, N] bf16, or f32 partials [splits, M, N] that XLA sums when K is split."""
  if splits == 1:
    return jax.ShapeDtypeStruct((m, n), jnp.bfloat16)
  return jax.ShapeDtypeStruct((splits, m, n), jnp.float32)


def acc_pipeline(step, in_specs, steps: int, stages: int, acc_shape):
  """The K pipeline of every GEMV kernel here: `steps` TMA steps through min(stages, steps)
  slots, each step(*smem_refs, acc) -> acc on an f32 WGMMA-layout accumulator that starts at 0."""
  return plgpu.emit_pipeline(
    lambda _, *smem_and_acc: step(*smem_and_acc),
    grid=(steps,),
    in_specs=in_specs,
    max_concurrent_steps=min(stages, steps),
    init_carry=plgpu.layout_cast(jnp.zeros(acc_shape, jnp.float32), plgpu.Layout.WGMMA),
  )


def launch(kernel, out_type, n_blocks: int, splits: int):
  """The (n, k) grid launch every GEMV kernel here uses: one warpgroup per CTA, Lane semantics."""
  return plgpu.kernel(
    kernel,
    out_type=out_type,
    grid=(n_blocks, splits),
    grid_names=("n", "k"),
    compiler_params=plgpu.CompilerParams(
      lowering_semantics=plgpu.LoweringSemantics.Lane,
      # SMEM is only read by threads and written by TMA; `_step` syncs the warpgroup itself once
      # its reads of a slot are done, before the pipeline refills that slot.
      unsafe_no_auto_barriers=True,
    ),
  )


def use_kernel(implementation: str | None, supported: bool) -> bool:
  """implementation: None (the kernel where supported, else XLA), "mosaic" (the kernel, or its
  config check raises), "xla"."""
  if implementation not in (None, "mosaic", "xla"):
    raise ValueError(f"unknown implementation {implementation!r}")
  return implementation == "mosaic" or (implementation is None and supported)


def _mosaic_matmul(x_MK: jax.Array, w: NVFP4Weight, config: TuningConfig) -> jax.Array:
  (m, k), n = x_MK.shape, w.shape[1]
  config, nb, nt = checked_plan(config, default_config, m, k, n)
  tn, splits, L = config.tile_n, config.split_k, config.lines
  steps = k // TILE_K // L // splits
  acc_shape = (64 * nb, 8 * nt)
  acc_type = plgpu.ShapeDtypeStruct(acc_shape, jnp.float32, layout=plgpu.Layout.WGMMA)

  @plgpu.inline_mgpu(
    arg_types=(
      *(plgpu.RefType(_SWIZZLED), plgpu.RefType(), plgpu.RefType(_SWIZZLED)) * L,
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
    acc = _step(ops, nb, nt, m, line_bufs, _acc_unpack(acc_fa, nb, nt), w.bit_order)
    return _acc_pack(acc, acc_fa, nb, nt)

  @plgpu.inline_mgpu(
    arg_types=(plgpu.Layout.WGMMA, plgpu.RefType(), plgpu.RefType(), plgpu.RefType())
  )
  def epilogue(ctx, acc_fa, red_ref, g_ref, o_ref):
    del ctx
    ops = _MlirOps()
    acc = _acc_unpack(acc_fa, nb, nt)
    _epilogue(ops, nb, nt, m, acc, red_ref, g_ref, o_ref, w.global_divides)

  def kernel(x_gmem, w_gmem, s_gmem, g_gmem, o_gmem):
    rows = pl.ds(jnp.minimum(jax.lax.axis_index("n") * tn, n - tn), tn)
    k0 = jax.lax.axis_index("k") * steps
    specs = []
    for j in range(L):  # line j of step i is 256-k line (k0 + i) L + j
      line = lambda i, j=j: (0, (k0 + i) * L + j, 0)  # noqa: E731
      specs += [
        plgpu.BlockSpec((tn, 1, TILE_K // 2), line, transforms=_SWIZZLED),
        plgpu.BlockSpec((tn, 1, TILE_K // GROUP), line),
        plgpu.BlockSpec((m, TILE_K // 64, 64), line, transforms=_SWIZZLED),
      ]
    pipeline = acc_pipeline(step, specs, steps, config.max_concurrent_steps, acc_shape)
    acc = pipeline(*(w_gmem.at[rows], s_gmem.at[rows], x_gmem) * L)
    out = o_gmem.at[:, rows] if splits == 1 else o_gmem.at[jax.lax.axis_index("k"), :, rows]
    # The pipeline's buffers are free again here, so the reduction scratch reuses their SMEM.
    pl.run_scoped(
      lambda red: epilogue(acc, red, g_gmem.at[rows], out),
      plgpu.SMEM((4, tn, 8 * nt), jnp.float32),
    )

  call = launch(kernel, gemv_out_type(m, n, splits), math.ceil(n / tn), splits)
  # Row-major reshapes: free in XLA, and they give TMA one 128-byte line per block row.
  out = call(
    x_MK.astype(jnp.bfloat16).reshape(m, k // 64, 64),
    w.packed_NP.reshape(n, k // TILE_K, TILE_K // 2),
    w.scales_NG.reshape(n, k // TILE_K, TILE_K // GROUP),
    w.global_scale_N.astype(jnp.float32),
  )
  return out if splits == 1 else out.sum(0).astype(jnp.bfloat16)


# ------------------------------------------------------------------------------------------------
# Public entry points.


def reference(x_MK: jax.Array, w: QuantizedWeight) -> jax.Array:
  """Plain jnp: dequantize to f32, f32 matmul, bf16 result (any quantized weight type)."""
  w_KN = w.dequantize(jnp.float32)
  y = jnp.dot(x_MK.astype(jnp.float32), w_KN, precision=jax.lax.Precision.HIGHEST)
  return y.astype(jnp.bfloat16)


def xla_matmul(x_MK: jax.Array, w: QuantizedWeight) -> jax.Array:
  """The fallback: XLA dequantizes to bf16 and runs its own dot (slow on GPU for 4-bit weights:
  DESIGN.md 9; any quantized weight type)."""
  return jnp.dot(x_MK.astype(jnp.bfloat16), w.dequantize(jnp.bfloat16)).astype(jnp.bfloat16)


def kernel_takes(x_MK: jax.Array, weight_ndim_ok: bool, check_config) -> bool:
  """Whether a GEMV kernel here serves this call: a GPU, 2-D x, an unbatched weight, and a tuning
  config whose check_config(m, k) passes (its ValueError means the shape does not fit)."""
  if x_MK.ndim != 2 or not weight_ndim_ok or jax.default_backend() != "gpu":
    return False
  try:
    check_config(*x_MK.shape)
  except ValueError:
    return False
  return True


def supported(x_MK: jax.Array, w: NVFP4Weight, config: TuningConfig | None = None) -> bool:
  n = w.shape[1]
  check = lambda m, k: (config or default_config(m, k, n)).check(m, k, n)  # noqa: E731
  return kernel_takes(x_MK, w.packed_NP.ndim == 2, check)


def dispatch(x_MK, w, config, implementation, *, supported, fallback, kernel) -> jax.Array:
  """The one dispatch of every weight type's public matmul here: kernel(x_MK, w, config) where
  `use_kernel(implementation, supported(x_MK, w, config))`, else fallback(x_MK, w)."""
  if not use_kernel(implementation, supported(x_MK, w, config)):
    return fallback(x_MK, w)
  return kernel(x_MK, w, config)


def _kernel_matmul(x_MK: jax.Array, w: NVFP4Weight, config: TuningConfig | None) -> jax.Array:
  m, k = x_MK.shape
  return _mosaic_matmul(x_MK, w, config or default_config(m, k, w.shape[1]))


@functools.partial(jax.jit, static_argnames=("config", "implementation"))
def nvfp4_matmul(x_MK: jax.Array, w: NVFP4Weight, *, config=None, implementation=None) -> jax.Array:
  """x [M, K] @ w (K, N) -> bf16 [M, N]; the Mosaic GPU kernel where it applies, else XLA (see
  `use_kernel` for `implementation`)."""
  return dispatch(
    x_MK, w, config, implementation, supported=supported, fallback=xla_matmul, kernel=_kernel_matmul
  )


# ------------------------------------------------------------------------------------------------
# Benchmark.


def random_weight(key, k: int, n: int, copies: int = 1) -> NVFP4Weight:
  """Random codes, E4M3 block scales spread over [2^-6, 2^6], global scale per column."""
  k1, k2, k3 = jax.random.split(key, 3)
  lead = (copies,) if copies > 1 else ()
  packed = jax.random.bits(k1, (*lead, n, k // 2), jnp.uint8)
  scales = jnp.exp2(jax.random.uniform(k2, (*lead, n, k // GROUP), minval=-6, maxval=6))
  g = jax.random.uniform(k3, (*lead, n), minval=0.5, maxval=2.0)
  return NVFP4Weight(packed, scales.astype(jnp.float8_e4m3fn), g)


def rel_err(y, ref) -> float:
  y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
  return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def bench_start() -> None:
  """The first step of every kernel benchmark's main: serial CUDA graphs (`call_times_us` sums
  kernel times over independent calls; see specdec.xla_env.serialize_graphs), then the versions."""
  xla_env.serialize_graphs()
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}", flush=True)


def call_times_us(fn, args, calls: int, iterations: int) -> list[float]:
  """Device time per call: CUPTI's summed kernel time per run / calls; wall clock without CUPTI."""
  from jax.experimental.mosaic.gpu import profiler

  try:
    _, runs = profiler.measure(fn, iterations=iterations)(*args)
    return [1e3 * t / calls for t in (runs if isinstance(runs, list) else [runs])]
  except Exception as e:  # noqa: BLE001 -- CUPTI may be unavailable; fall back to wall clock
    print(f"  CUPTI unavailable ({type(e).__name__}: {e}); using wall clock", file=sys.stderr)
  jax.block_until_ready(fn(*args))
  t0 = time.perf_counter()
  for _ in range(iterations):
    jax.block_until_ready(fn(*args))
  return [1e6 * (time.perf_counter() - t0) / iterations / calls]


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
  w_list = by_order[orders[0]]
  dense = jax.random.normal(jax.random.key(1), (copies, k, n), jnp.bfloat16)
  dense_list = [dense[c] for c in range(copies)]
  q_bytes = k * n // 2 + k * n // GROUP
  for m in ms:
    x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
    ref = reference(x, w_list[0])
    xla_fn = jax.jit(lambda x, ds: [jnp.dot(x, d) for d in ds])
    t_xla = statistics.median(call_times_us(xla_fn, (x, dense_list), copies, iterations))
    for config, order in itertools.product(configs or [default_config(m, k, n)], orders):
      w_list = by_order[order]
      row = dict(m=m, k=k, n=n, config=config, order=order, xla_us=t_xla)
      row["xla_tbs"] = 2 * k * n / t_xla / 1e6
      try:
        one = jax.jit(functools.partial(nvfp4_matmul, config=config, implementation="mosaic"))
        t0 = time.perf_counter()
        compiled = one.lower(x, w_list[0]).compile()
        row["compile_s"] = time.perf_counter() - t0
        y = compiled(x, w_list[0])
        row["rel_err"] = rel_err(y, ref)
        chain = jax.jit(
          lambda x, ws, config=config: [nvfp4_matmul(x, w, config=config) for w in ws]
        )
        t = statistics.median(call_times_us(chain, (x, w_list), copies, iterations))
        row.update(us=t, tbs=q_bytes / t / 1e6)
      except Exception as e:  # noqa: BLE001 -- report the failure in the table and keep going
        row["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        print(f"FAILED m={m} k={k} n={n} {config}: {row['error']}", file=sys.stderr)
      rows.append(row)
      print(_format_row(row), flush=True)
  return rows


def _format_row(r: dict) -> str:
  head = f"M={r['m']:2d} KxN={r['k']}x{r['n']} tile_n={r['config'].tile_n} "
  head += f"stages={r['config'].max_concurrent_steps} split_k={r['config'].split_k} "
  head += f"lines={r['config'].lines} "
  head += f"order={r.get('order', '-')}"
  xla = f"XLA bf16 {r['xla_us']:7.1f} us {r['xla_tbs']:.2f} TB/s"
  if "error" in r:
    return f"{head} | FAILED | {xla}"
  return (
    f"{head} | {r['us']:6.1f} us {r['tbs']:.2f} TB/s {100 * r['tbs'] / COPY_CEILING_TBS:3.0f}% "
    f"| {xla} | x{r['xla_us'] / r['us']:.2f} | compile {r['compile_s']:.1f} s "
    f"| rel_err {r['rel_err']:.1e}"
  )


def check_case(name: str, measure) -> bool:
  """One GPU check: measure() -> (passed, message). A failure to compile or run prints the
  compiler's message and fails the case, so the remaining cases still run."""
  try:
    passed, message = measure()
  except Exception as e:  # noqa: BLE001 -- print the compiler's message and go on
    passed, message = False, f"FAILED {type(e).__name__}: {str(e)[:3000]}"
  print(f"{name}: {message}", flush=True)
  return passed


def check_against(matmul, ref, x_MK, w, config, bound: float = 1e-2) -> tuple[bool, str]:
  """The kernel (forced) against `ref` on one case, for `check_case`."""
  err = rel_err(matmul(x_MK, w, config=config, implementation="mosaic"), ref(x_MK, w))
  return err < bound, f"rel_err {err:.2e}"


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
      case = functools.partial(check_against, nvfp4_matmul, reference, x, w, config)
      ok &= check_case(f"check M={m} K={k} N={n} {config} {order}", case)
  return ok


def bench_parser(doc: str) -> argparse.ArgumentParser:
  """The flags of a GEMV kernel's check / bench `main()` (NVFP4 and FP8 alike)."""
  p = argparse.ArgumentParser(description=doc.splitlines()[0])
  p.add_argument("--mode", default="all", choices=["check", "bench", "all"])
  p.add_argument("--check_ms", default="1,3,8,16")
  p.add_argument("--shapes", default="8192x28672,5120x17408", help="KxN list")
  p.add_argument("--ms", default="1,4,8,16")
  p.add_argument("--copies", type=int, default=4, help="weight sets cycled to defeat L2")
  p.add_argument("--iterations", type=int, default=5)
  p.add_argument("--tile_n", default="", help="comma list to sweep (default: heuristic)")
  p.add_argument("--stages", default="4")
  p.add_argument("--split_k", default="1")
  return p


def bench_configs(args, config_cls, lines: str = "1") -> list:
  """The tuning configs a bench's flags sweep (tile_n x stages x split_k x lines); none when
  --tile_n is empty (the heuristic's then)."""
  return [
    config_cls(int(t), int(s), int(sk), int(li))
    for t in args.tile_n.split(",")
    if t
    for s in args.stages.split(",")
    for sk in args.split_k.split(",")
    for li in lines.split(",")
  ]


def main(argv=None) -> None:
  p = bench_parser(__doc__)
  p.add_argument("--orders", default="kernel", help="bit orders of the codes to sweep")
  p.add_argument("--lines", default="1", help="code lines per pipeline step to sweep")
  args = p.parse_args(argv)
  bench_start()
  if args.mode in ("check", "all"):
    check([int(m) for m in args.check_ms.split(",")])
  if args.mode == "check":
    return
  rows = []
  for shape in args.shapes.split(","):
    k, n = map(int, shape.split("x"))
    configs = bench_configs(args, TuningConfig, args.lines)
    ms = [int(m) for m in args.ms.split(",")]
    orders = tuple(args.orders.split(","))
    rows += bench_shape(k, n, ms, args.copies, args.iterations, configs, orders)
  print("\n| M | K x N | tile_n/stages/split_k/lines/order | us | TB/s | % of 4.24 ", end="")
  print("| XLA bf16 us | XLA TB/s | XLA time / kernel time | compile s |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    c = r["config"]
    cfg = f"{c.tile_n}/{c.max_concurrent_steps}/{c.split_k}/{c.lines}/{r['order']}"
    if "error" in r:
      print(f"| {r['m']} | {r['k']}x{r['n']} | {cfg} | FAILED | | | {r['xla_us']:.1f} | | | |")
      continue
    print(
      f"| {r['m']} | {r['k']}x{r['n']} | {cfg} | {r['us']:.1f} | {r['tbs']:.2f} "
      f"| {100 * r['tbs'] / COPY_CEILING_TBS:.0f}% | {r['xla_us']:.1f} | {r['xla_tbs']:.2f} "
      f"| {r['xla_us'] / r['us']:.2f} | {r['compile_s']:.1f} |"
    )


if __name__ == "__main__":
  main()
