"""W8A16 FP8 GEMV / skinny GEMM for Hopper: x [M, K] bf16 @ W (K, N) -> [M, N] bf16, M = 1..16.

W is an `FP8Weight`: E4M3 codes [N, K] (K-contiguous) and an f32 scale per output column.

Mosaic GPU (`plgpu.kernel` + `plgpu.emit_pipeline`), per-step arithmetic as PTX through
`plgpu.inline_mgpu`. The structure is nvfp4_gemv's and the machinery kernels_pallas/gemv_common.py
(lanes, SMEM swizzle, mma.sync accumulators, cross-warp reduction epilogue, numpy model, MLIR
emitter); this file holds what differs: the FP8 decode and the K step of 128.

One CTA = one warpgroup owning `tile_n` = 16 R output features. Per pipeline step the codes
[tile_n, 128 B] and x [M, 128] bf16, both 128B-swizzled; warp w takes 32 of the 128 k for all R
row blocks, lane q of a quad reading 8 bytes of a row at nvfp4's code offsets (so the swizzle keeps
those reads conflict-free). The epilogue multiplies the column scale. The bound is HBM.

Decode (exact, integer): a code byte s eeee mmm becomes the bf16 bits s 0000 eeee mmm 0000, the
E4M3 value times 2^-120 (e = 0 lands on bf16 subnormals); one `mul.bf16x2` by 2^120 makes it
exact. A word of codes k0..k3 gives two bf16x2, (k0, k2) and (k1, k3): 7 integer ops + 2
multiplies per 4 weights; x pairs the same way with 2 `prmt` per 4 k. NaN codes (0x7F, 0xFF;
quantizers never write them) decode to +-480 instead of NaN.

Testing without a GPU: `emulate()` runs the kernel's own `_step` and the shared epilogue on numpy
lanes; lowering for cuda works on a CPU-only jaxlib. Figures and tried variants:
docs/benchmarks.md ("Kernel notes moved from the code", and its FP8 section).
"""

import dataclasses
import functools
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
from kernels_pallas import nvfp4_gemv as nv
from kernels_pallas.h200 import COPY_CEILING_TBS
from specdec.quant.fp8 import FP8Weight, random_weight

TILE_K = 128  # k per pipeline step: one 128-byte swizzle line of codes per weight row
BLOCK_ROWS = gemv.BLOCK_ROWS
DECODE_SHIFT = 120  # decoded bf16 = E4M3 value * 2^-DECODE_SHIFT before the multiply

DECODE_PTX = """{
.reg .b32 a, b, s;
mov.b32 s, 0x7B807B80;
shl.b32 a, $2, 8;
shl.b32 b, $2, 4;
and.b32 b, b, 0x07F007F0;
lop3.b32 a, a, b, 0x80008000, 0xEC;
mul.rn.bf16x2 $0, a, s;
shr.u32 b, $2, 4;
and.b32 b, b, 0x07F007F0;
lop3.b32 a, $2, b, 0x80008000, 0xEC;
mul.rn.bf16x2 $1, a, s;
}"""  # 0x7B80 = bf16 2^120; lop3 0xEC = (a & c) | b


@dataclasses.dataclass(frozen=True)
class TuningConfig(nv.TuningConfig):
  """nvfp4_gemv's knobs and checks, with this kernel's step of 128 k (128 bytes per row there and
  here)."""

  k_step: ClassVar[int] = TILE_K

  def check(self, m: int, k: int, n: int) -> None:
    super().check(m, k, n)
    if self.lines != 1:
      raise ValueError(f"lines={self.lines}: the FP8 kernel streams one code line per step")


def default_config(m: int, k: int, n: int) -> TuningConfig:
  """NVFP4's row balancing: its only use of K is divisibility by its step of 256 k, which holds
  128 bytes per row as our step of 128 k does, so it is asked about the K of equal bytes. (Its
  split of one-CTA-per-SM plans along K was tuned on the NVFP4 kernel.)"""
  c = nv.default_config(m, 2 * k, n)
  return TuningConfig(tile_n=c.tile_n, split_k=c.split_k)


# ------------------------------------------------------------------------------------------------
# The per-step algorithm, written once for the emitter and the numpy emulator.


def x_offset(n, chunk, half):
  """Byte offset of the lane's 8 x values (k = 16 chunk + 8 half + [0, 8)) of token n."""
  return n * 2 * TILE_K + (chunk << 5) + (half << 4)


def _step(ops, nb: int, nt: int, m: int, w_buf, x_buf, acc):
  """One K step of 128 for one warp's quarter of it; `acc[b, j]` are the 4 f32 C-fragment values
  of row block b (rows 16 b + g, + 8) and token tile j. Word u of a lane's 8 codes holds its
  k + 4u .. + 3; the mma's logical k pairs (2q, 2q + 1) and (2q + 8, 2q + 9) are (k, k + 2) and
  (k + 1, k + 3) of that word on both operands."""
  warp, g, q = gemv.lanes(ops.tid)
  chunk, half = gemv.k_chunk(warp, q)
  words = {}
  for b in range(nb):
    for i in range(2):
      row = g + (BLOCK_ROWS * b + 8 * i)
      words[b, i] = ops.load(w_buf, gemv.w_offset(row, chunk, half), 2, swizzled=True)
  xs = {}
  for j in range(nt):
    n = ops.min(g + 8 * j, m - 1)  # padded tokens repeat the last one; their columns are dropped
    x01, x23, x45, x67 = ops.load(x_buf, x_offset(n, chunk, half), 4, swizzled=True)
    for u, (lo, hi) in enumerate(((x01, x23), (x45, x67))):
      xs[j, u] = (ops.prmt(lo, hi, gemv.PAIR_LO), ops.prmt(lo, hi, gemv.PAIR_HI))
  ops.release()  # every SMEM read of this slot is done; the pipeline may refill it
  for b in range(nb):
    for u in range(2):
      (even0, odd0), (even1, odd1) = (ops.decode(words[b, i][u]) for i in range(2))
      for j in range(nt):
        acc[b, j] = ops.mma((even0, even1, odd0, odd1), xs[j, u], acc[b, j])
  return acc


# ------------------------------------------------------------------------------------------------
# Numpy model and MLIR emitter: gemv_common's, with the FP8 decode and a plain column scale.


def decode_word_np(word) -> list[np.ndarray]:
  """DECODE_PTX on uint32 arrays: [bf16x2 of bytes (0, 2), bf16x2 of bytes (1, 3)]."""
  q = np.asarray(word, np.uint32)
  sign, mag = np.uint32(0x80008000), np.uint32(0x07F007F0)
  pairs = [((q << np.uint32(8)) & sign) | ((q << np.uint32(4)) & mag)]
  pairs.append((q & sign) | ((q >> np.uint32(4)) & mag))
  out = []
  for bits in pairs:
    halves = [
      gemv.f32_to_bf16_bits(
        gemv.bf16_bits_to_f32((bits >> np.uint32(sh)) & np.uint32(0xFFFF))
        * np.float32(2.0**DECODE_SHIFT)
      )
      for sh in (0, 16)
    ]
    out.append(halves[0] | (halves[1] << np.uint32(16)))
  return out


class _NumpyOps(gemv.NumpyOps):
  def decode(self, word):
    return decode_word_np(word)

  def out_factor(self, scale_ref, row, divides):
    del divides  # FP8 scales always multiply
    return np.asarray(scale_ref, np.float32)[row]


class _MlirOps(gemv.MlirOps):
  def decode(self, word):
    return gemv.mlir()[-1].inline_ptx(DECODE_PTX, word, result_types=[self.i32] * 2)

  def out_factor(self, scale_ref, row, divides):
    del divides
    return gemv.mlir()[3].load(scale_ref, [self.index(row)])


def emulate(x_MK, w: FP8Weight, config: TuningConfig | None = None) -> np.ndarray:
  """The kernel's exact data movement and arithmetic on numpy; returns f32 [M, N] (pre-bf16).

  Slot i of each pipeline buffer sits at i * slot bytes from a 1024-aligned allocation, as in
  Pallas, so x slots of M not divisible by 4 exercise the swizzle on 256-aligned addresses.
  """
  x_MK = np.asarray(x_MK)
  (m, k), n = x_MK.shape, w.shape[1]
  config, nb, nt = gemv.checked_plan(config, default_config, m, k, n)
  tn = config.tile_n
  codes = np.asarray(w.codes_NK).view(np.uint8).reshape(n, k // TILE_K, TILE_K)
  x = np.asarray(x_MK.astype(ml_dtypes.bfloat16)).reshape(m, k // TILE_K, TILE_K)
  scale_N = np.asarray(w.scale_N, np.float32)
  ops = _NumpyOps()
  out = np.zeros((config.split_k, m, n), np.float32)
  steps = k // TILE_K // config.split_k
  stages = min(config.max_concurrent_steps, steps)
  for blk in range(math.ceil(n / tn)):
    rows = slice(gemv.row_start(blk, n, tn), gemv.row_start(blk, n, tn) + tn)
    for split in range(config.split_k):
      acc = {
        (b, j): [np.zeros(128, np.float32) for _ in range(4)] for b in range(nb) for j in range(nt)
      }
      for step in range(split * steps, (split + 1) * steps):
        slot = (step - split * steps) % stages
        w_buf = gemv.SmemImage.in_slot(codes[rows, step], slot, swizzled=True)
        x_buf = gemv.SmemImage.in_slot(x[:, step], slot, swizzled=True)
        acc = _step(ops, nb, nt, m, w_buf, x_buf, acc)
      red = np.full((4, tn, 8 * nt), np.nan, np.float32)
      gemv.epilogue(ops, nb, nt, m, acc, red, scale_N[rows], out[split][:, rows], False)
  return out.sum(0)


# ------------------------------------------------------------------------------------------------
# The kernel.


def _check_operands(x_MK: jax.Array, w: FP8Weight) -> None:
  if x_MK.ndim != 2 or w.codes_NK.ndim != 2:
    raise ValueError(
      f"fp8_matmul takes x_MK [M, K] and codes_NK [N, K], got {x_MK.shape} and {w.codes_NK.shape}"
    )
  if x_MK.shape[1] != w.shape[0]:
    raise ValueError(
      f"x_MK has K={x_MK.shape[1]} but codes_NK {w.codes_NK.shape} has K={w.shape[0]}"
    )
  if w.scale_N.shape != (w.shape[1],):
    raise ValueError(f"scale_N must be [N={w.shape[1]}], got {w.scale_N.shape}")


@functools.partial(jax.jit, static_argnames=("config",))
def fp8_matmul(x_MK: jax.Array, w: FP8Weight, *, config: TuningConfig | None = None) -> jax.Array:
  """x [M, K] @ w (K, N) -> bf16 [M, N] through the kernel (`default_config`'s plan if config is
  None); operands or a config that do not fit raise ValueError. When the model runs it:
  specdec.ops.qmatmul.matmul."""
  _check_operands(x_MK, w)
  (m, k), n = x_MK.shape, w.shape[1]
  config, nb, nt = gemv.checked_plan(config, default_config, m, k, n)
  tn, splits = config.tile_n, config.split_k
  steps = k // TILE_K // splits
  acc_shape = (64 * nb, 8 * nt)
  acc_type = plgpu.ShapeDtypeStruct(acc_shape, jnp.float32, layout=plgpu.Layout.WGMMA)

  @plgpu.inline_mgpu(
    arg_types=(plgpu.RefType(gemv.SWIZZLED), plgpu.RefType(gemv.SWIZZLED), plgpu.Layout.WGMMA),
    return_type=acc_type,
  )
  def step(ctx, w_ref, x_ref, acc_fa):
    del ctx
    ops = _MlirOps()
    w_buf = ops.smem(w_ref, tn * TILE_K)
    x_buf = ops.smem(x_ref, m * TILE_K * 2)
    acc = _step(ops, nb, nt, m, w_buf, x_buf, gemv.acc_unpack(acc_fa, nb, nt))
    return gemv.acc_pack(acc, acc_fa, nb, nt)

  @plgpu.inline_mgpu(
    arg_types=(plgpu.Layout.WGMMA, plgpu.RefType(), plgpu.RefType(), plgpu.RefType())
  )
  def epilogue(ctx, acc_fa, red_ref, scale_ref, o_ref):
    del ctx
    acc = gemv.acc_unpack(acc_fa, nb, nt)
    gemv.epilogue(_MlirOps(), nb, nt, m, acc, red_ref, scale_ref, o_ref, False)

  def kernel(x_gmem, w_gmem, scale_gmem, o_gmem):
    rows = pl.ds(jnp.minimum(jax.lax.axis_index("n") * tn, n - tn), tn)
    k0 = jax.lax.axis_index("k") * steps
    specs = [
      plgpu.BlockSpec((tn, 1, TILE_K), lambda i: (0, k0 + i, 0), transforms=gemv.SWIZZLED),
      plgpu.BlockSpec((m, TILE_K // 64, 64), lambda i: (0, k0 + i, 0), transforms=gemv.SWIZZLED),
    ]
    pipeline = gemv.acc_pipeline(step, specs, steps, config.max_concurrent_steps, acc_shape)
    acc = pipeline(w_gmem.at[rows], x_gmem)
    out = o_gmem.at[:, rows] if splits == 1 else o_gmem.at[jax.lax.axis_index("k"), :, rows]
    # The pipeline's buffers are free again here, so the reduction scratch reuses their SMEM.
    pl.run_scoped(
      lambda red: epilogue(acc, red, scale_gmem.at[rows], out),
      plgpu.SMEM((4, tn, 8 * nt), jnp.float32),
    )

  call = gemv.launch(kernel, gemv.gemv_out_type(m, n, splits), math.ceil(n / tn), splits)
  # Bitcast and row-major reshapes: free in XLA; TMA gets one 128-byte line per block row.
  out = call(
    x_MK.astype(jnp.bfloat16).reshape(m, k // 64, 64),
    jax.lax.bitcast_convert_type(w.codes_NK, jnp.uint8).reshape(n, k // TILE_K, TILE_K),
    w.scale_N.astype(jnp.float32),
  )
  return out if splits == 1 else out.sum(0).astype(jnp.bfloat16)


def check_shape(m: int, w: FP8Weight) -> None:
  """Raises ValueError unless the kernel takes x [m, K] @ w: an unbatched weight and a default
  config whose check passes (what specdec.ops.qmatmul asks before it picks the kernel)."""
  if w.codes_NK.ndim != 2:
    raise ValueError(f"the FP8 kernel takes one weight, got codes_NK {w.codes_NK.shape}")
  k, n = w.shape
  default_config(m, k, n).check(m, k, n)


def reference(x_MK: jax.Array, w: FP8Weight) -> jax.Array:
  """Plain jnp: dequantize to f32, f32 matmul, bf16 result."""
  w_KN = w.dequantize(jnp.float32)
  y = jnp.dot(x_MK.astype(jnp.float32), w_KN, precision=jax.lax.Precision.HIGHEST)
  return y.astype(jnp.bfloat16)


# ------------------------------------------------------------------------------------------------
# Benchmark and GPU check.


def _timed_rows(k: int, n: int, m: int, w_list, dense_list, configs, iterations: int):
  """Kernel rows for one (M, K, N): compile time, error against `reference`, CUPTI time over the
  weight copies; XLA's bf16 dot and the XLA FP8 fallback timed on the same copies."""
  copies = len(w_list)
  x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
  ref = reference(x, w_list[0])
  t_xla = bench_util.dot_us(x, dense_list, iterations)
  fallback = jax.jit(lambda x, ws: [jnp.dot(x, w.dequantize(jnp.bfloat16)) for w in ws])
  t_fallback = bench_util.median_us(fallback, (x, w_list), copies, iterations)
  for config in configs or [default_config(m, k, n)]:
    row = dict(m=m, k=k, n=n, config=config, xla_us=t_xla, fallback_us=t_fallback)
    matmul = functools.partial(fp8_matmul, config=config)
    row |= bench_util.time_kernel(f"m={m} k={k} n={n} {config}", matmul, x, w_list, ref, iterations)
    print(_format_row(row), flush=True)
    yield row


def _format_row(r: dict) -> str:
  c = r["config"]
  cells = [str(r["m"]), f"{r['k']}x{r['n']}", f"{c.tile_n}/{c.max_concurrent_steps}/{c.split_k}"]
  if "error" in r:
    cells += ["FAILED"] + [""] * 4
  else:
    tbs = (r["k"] * r["n"] + 4 * r["n"]) / r["us"] / 1e6
    cells += [
      f"{r['us']:.1f}",
      f"{tbs:.2f}",
      f"{100 * tbs / COPY_CEILING_TBS:.0f}%",
      f"{r['rel_err']:.1e}",
      f"{r['compile_s']:.1f}",
    ]
  xla_tbs = 2 * r["k"] * r["n"] / r["xla_us"] / 1e6
  cells += [f"{r['xla_us']:.1f} ({xla_tbs:.2f})", f"{r['fallback_us']:.1f}"]
  cells.append(f"{r['xla_us'] / r['us']:.2f}" if "us" in r else "")
  return "| " + " | ".join(cells) + " |"


TABLE_HEAD = (
  "| M | K x N | tile_n/stages/split_k | us | TB/s | % of 4.24 | rel_err | compile s "
  "| XLA bf16 dot us (TB/s) | XLA FP8 fallback us | XLA bf16 / kernel |\n"
  "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def bench(shapes, ms, copies: int, iterations: int, configs) -> list[dict]:
  rows = []
  for k, n in shapes:
    ws = random_weight(jax.random.key(k * 131 + n), k, n, copies)
    w_list = [jax.tree.map(lambda a, c=c: a[c], ws) for c in range(copies)]
    dense_list = bench_util.dense_weights(k, n, copies)
    for m in ms:
      rows += list(_timed_rows(k, n, m, w_list, dense_list, configs, iterations))
  return rows


def check(ms, k: int = 4096, n: int = 1024) -> bool:
  """The kernel against `reference` on the GPU, default config and a split-K one; prints errors."""
  ok = True
  for config in (None, TuningConfig(48, 2, 2)):
    for m in ms:
      w = random_weight(jax.random.key(m), k, n)
      x = jax.random.normal(jax.random.key(m + 1), (m, k), jnp.bfloat16)
      case = functools.partial(bench_util.check_against, fp8_matmul, reference, x, w, config)
      ok &= bench_util.check_case(f"check M={m} K={k} N={n} {config}", case)
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
) -> None:
  """The GPU check and/or the benchmark (mode check, bench or all) over shapes (K, N) and the
  configs tile_n x stages x split_k (the heuristic's where tile_n is empty), with `copies` weight
  sets so that L2 holds none; run by experiments/bench_kernel.py --kernel=fp8."""
  if mode in ("check", "all") and not check(list(check_ms)):
    print("CHECK FAILED", flush=True)
  if mode == "check":
    return
  configs = bench_util.config_sweep(TuningConfig, tile_n, stages, split_k)
  print(TABLE_HEAD, flush=True)
  rows = bench(list(shapes), list(ms), copies, iterations, configs)
  print("\n" + TABLE_HEAD)
  print("\n".join(_format_row(r) for r in rows))
