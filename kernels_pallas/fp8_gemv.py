"""W8A16 FP8 GEMV / skinny GEMM for Hopper: x [M, K] bf16 @ W (K, N) -> [M, N] bf16, M = 1..16.

W is an `FP8Weight`: E4M3 codes [N, K] (K-contiguous) and an f32 scale per output column.

Backend: Mosaic GPU (`plgpu.kernel` + `plgpu.emit_pipeline`), per-step arithmetic as PTX through
`plgpu.inline_mgpu`. The structure is kernels_pallas/nvfp4_gemv.py's, and so is most of the code:
the lane mapping, the SMEM swizzle, the mma.sync accumulators, the cross-warp reduction epilogue,
the numpy emulator and the MLIR emitter are imported from there; this file holds what differs, the
FP8 decode and the K step.

Structure. One CTA = one warpgroup owning `tile_n` = 16 R output features. K streams through a
TMA pipeline in steps of 128: per step the codes [tile_n, 128 B] and x [M, 128] bf16, both
128B-swizzled. Warp w takes 32 of the 128 k for all R row blocks (lane q of a quad reads 8 bytes
of a row: chunk w + 4 (q >> 1), half q & 1, the NVFP4 kernel's code offsets, so the same swizzle
makes those reads conflict-free). Four f32 mma.sync partials are summed through SMEM at the end and
multiplied by the column scale. The last CTA's rows are clamped to end at N.

Decode (exact, integer). A code byte s eeee mmm becomes the bf16 bits s 0000 eeee mmm 0000, that is
the E4M3 value times 2^-120 (e = 0 lands on bf16 subnormals, like E4M3's own subnormals); one
`mul.bf16x2` by 2^120 makes it exact. From a 32-bit word of codes k0..k3 two bf16x2 come out:
(k0, k2) from q << 8 (signs at bits 15/31) and q << 4 (magnitudes at [10:4]/[26:20]), and (k1, k3)
from q and q >> 4 the same way: 7 integer ops + 2 bf16x2 multiplies per 4 weights, half the
integer work per byte of the NVFP4 decode. The x fragment pairs (k0, k2) and (k1, k3) with 2
`prmt` per 4 k, once per warp for all row blocks. NaN codes (0x7F, 0xFF; quantizers never write
them) decode to +-480 instead of NaN.

Measured on the H200 (2026-11-30, jax 0.11.2, CUPTI kernel time, median of 5 runs over 4 weight
copies so L2 holds none; `PYTHONPATH=. python3 -m kernels_pallas.fp8_gemv --mode bench`;
TB/s = (K N + 4 N) bytes / time; XLA = its bf16 dot on a dense (K, N) weight, same run):

  M   K x N        tile_n  us    TB/s  % of 4.24  XLA us (TB/s)  XLA/kernel  compile s
  1   8192x28672   112     58.7  4.00  94%        105.6 (4.45)   1.80        0.4
  16  8192x28672   112     61.8  3.80  90%        110.8 (4.24)   1.79        0.4
  1   5120x17408   48      23.6  3.78  89%         42.3 (4.21)   1.80        0.3
  16  5120x17408   48      25.4  3.51  83%         45.5 (3.92)   1.79        0.3

(M = 4 and 8 lie between; a second process repeated M = 1 and 16 within 1%.) The bound is HBM:
the kernel moves codes at 90-95% of the copy ceiling on the large shape, so XLA/kernel tops out
near the 2x byte ratio. XLA's own FP8 fallback (dequantize, then dot) took 395-401 us and 156-160
us on the two shapes. Tried on 8192x28672: 3 stages ran 0-2% faster than 4 (60.5 vs 61.8 us at
M = 16), 6 stages slower (59.5 / 62.3 us), and badly so with 64- or 128-row tiles at M = 16
(89.7, 76.7 us); tile_n 64 and 128 matched 112 at 3-4 stages.

Testing without a GPU: `emulate()` runs the kernel's own `_step` and nvfp4's epilogue on numpy
lanes (SMEM images with the TMA swizzle, mma fragments per warp). The Pallas GPU interpreter
cannot run `inline_mgpu` PTX; lowering for cuda works on a CPU-only jaxlib (`jax.export`).
"""

import dataclasses
import functools
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

from kernels_pallas import nvfp4_gemv as nv
from specdec.quant.fp8 import FP8Weight

TILE_K = 128  # k per pipeline step: one 128-byte swizzle line of codes per weight row
BLOCK_ROWS = nv.BLOCK_ROWS
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
  128 bytes per row as our step of 128 k does, so it is asked about the K of equal bytes. Its
  split of one-CTA-per-SM plans along K was measured with the NVFP4 kernel only."""
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
  warp, g, q = nv._lanes(ops.tid)
  chunk, half = nv._k_chunk(warp, q)
  words = {}
  for b in range(nb):
    for i in range(2):
      row = g + (BLOCK_ROWS * b + 8 * i)
      words[b, i] = ops.load(w_buf, nv.w_offset(row, chunk, half), 2, swizzled=True)
  xs = {}
  for j in range(nt):
    n = ops.min(g + 8 * j, m - 1)  # padded tokens repeat the last one; their columns are dropped
    x01, x23, x45, x67 = ops.load(x_buf, x_offset(n, chunk, half), 4, swizzled=True)
    for u, (lo, hi) in enumerate(((x01, x23), (x45, x67))):
      xs[j, u] = (ops.prmt(lo, hi, nv.PAIR_LO), ops.prmt(lo, hi, nv.PAIR_HI))
  ops.release()  # every SMEM read of this slot is done; the pipeline may refill it
  for b in range(nb):
    for u in range(2):
      (even0, odd0), (even1, odd1) = (ops.decode(words[b, i][u]) for i in range(2))
      for j in range(nt):
        acc[b, j] = ops.mma((even0, even1, odd0, odd1), xs[j, u], acc[b, j])
  return acc


# ------------------------------------------------------------------------------------------------
# Numpy model and MLIR emitter: nvfp4's, with the FP8 decode and a plain column scale.


def decode_word_np(word) -> list[np.ndarray]:
  """DECODE_PTX on uint32 arrays: [bf16x2 of bytes (0, 2), bf16x2 of bytes (1, 3)]."""
  q = np.asarray(word, np.uint32)
  sign, mag = np.uint32(0x80008000), np.uint32(0x07F007F0)
  pairs = [((q << np.uint32(8)) & sign) | ((q << np.uint32(4)) & mag)]
  pairs.append((q & sign) | ((q >> np.uint32(4)) & mag))
  out = []
  for bits in pairs:
    halves = [
      nv._f32_to_bf16_bits(
        nv._bf16_bits_to_f32((bits >> np.uint32(sh)) & np.uint32(0xFFFF))
        * np.float32(2.0**DECODE_SHIFT)
      )
      for sh in (0, 16)
    ]
    out.append(halves[0] | (halves[1] << np.uint32(16)))
  return out


class _NumpyOps(nv._NumpyOps):
  def decode(self, word):
    return decode_word_np(word)

  def out_factor(self, scale_ref, row, divides):
    del divides  # FP8 scales always multiply
    return np.asarray(scale_ref, np.float32)[row]


class _MlirOps(nv._MlirOps):
  def decode(self, word):
    return nv._mlir()[-1].inline_ptx(DECODE_PTX, word, result_types=[self.i32] * 2)

  def out_factor(self, scale_ref, row, divides):
    del divides
    return nv._mlir()[3].load(scale_ref, [self._index(row)])


def emulate(x_MK, w: FP8Weight, config: TuningConfig | None = None) -> np.ndarray:
  """The kernel's exact data movement and arithmetic on numpy; returns f32 [M, N] (pre-bf16).

  Slot i of each pipeline buffer sits at i * slot bytes from a 1024-aligned allocation, as in
  Pallas, so x slots of M not divisible by 4 exercise the swizzle on 256-aligned addresses.
  """
  x_MK = np.asarray(x_MK)
  (m, k), n = x_MK.shape, w.shape[1]
  config, nb, nt = nv.checked_plan(config, default_config, m, k, n)
  tn = config.tile_n
  codes = np.asarray(w.codes_NK).view(np.uint8).reshape(n, k // TILE_K, TILE_K)
  x = np.asarray(x_MK.astype(ml_dtypes.bfloat16)).reshape(m, k // TILE_K, TILE_K)
  scale_N = np.asarray(w.scale_N, np.float32)
  ops = _NumpyOps()
  out = np.zeros((config.split_k, m, n), np.float32)
  steps = k // TILE_K // config.split_k
  stages = min(config.max_concurrent_steps, steps)
  for blk in range(math.ceil(n / tn)):
    rows = slice(nv._row_start(blk, n, tn), nv._row_start(blk, n, tn) + tn)
    for split in range(config.split_k):
      acc = {
        (b, j): [np.zeros(128, np.float32) for _ in range(4)] for b in range(nb) for j in range(nt)
      }
      for step in range(split * steps, (split + 1) * steps):
        slot = (step - split * steps) % stages
        w_buf = nv._SmemImage(codes[rows, step], slot * codes[rows, step].nbytes, swizzled=True)
        x_buf = nv._SmemImage(x[:, step], slot * x[:, step].nbytes, swizzled=True)
        acc = _step(ops, nb, nt, m, w_buf, x_buf, acc)
      red = np.full((4, tn, 8 * nt), np.nan, np.float32)
      nv._epilogue(ops, nb, nt, m, acc, red, scale_N[rows], out[split][:, rows], False)
  return out.sum(0)


# ------------------------------------------------------------------------------------------------
# The kernel.

_SWIZZLED = (plgpu.SwizzleTransform(128),)


def _mosaic_matmul(x_MK: jax.Array, w: FP8Weight, config: TuningConfig) -> jax.Array:
  (m, k), n = x_MK.shape, w.shape[1]
  config, nb, nt = nv.checked_plan(config, default_config, m, k, n)
  tn, splits = config.tile_n, config.split_k
  steps = k // TILE_K // splits
  acc_shape = (64 * nb, 8 * nt)
  acc_type = plgpu.ShapeDtypeStruct(acc_shape, jnp.float32, layout=plgpu.Layout.WGMMA)

  @plgpu.inline_mgpu(
    arg_types=(plgpu.RefType(_SWIZZLED), plgpu.RefType(_SWIZZLED), plgpu.Layout.WGMMA),
    return_type=acc_type,
  )
  def step(ctx, w_ref, x_ref, acc_fa):
    del ctx
    ops = _MlirOps()
    w_buf = ops.smem(w_ref, tn * TILE_K)
    x_buf = ops.smem(x_ref, m * TILE_K * 2)
    acc = _step(ops, nb, nt, m, w_buf, x_buf, nv._acc_unpack(acc_fa, nb, nt))
    return nv._acc_pack(acc, acc_fa, nb, nt)

  @plgpu.inline_mgpu(
    arg_types=(plgpu.Layout.WGMMA, plgpu.RefType(), plgpu.RefType(), plgpu.RefType())
  )
  def epilogue(ctx, acc_fa, red_ref, scale_ref, o_ref):
    del ctx
    acc = nv._acc_unpack(acc_fa, nb, nt)
    nv._epilogue(_MlirOps(), nb, nt, m, acc, red_ref, scale_ref, o_ref, False)

  def kernel(x_gmem, w_gmem, scale_gmem, o_gmem):
    rows = pl.ds(jnp.minimum(jax.lax.axis_index("n") * tn, n - tn), tn)
    k0 = jax.lax.axis_index("k") * steps
    specs = [
      plgpu.BlockSpec((tn, 1, TILE_K), lambda i: (0, k0 + i, 0), transforms=_SWIZZLED),
      plgpu.BlockSpec((m, TILE_K // 64, 64), lambda i: (0, k0 + i, 0), transforms=_SWIZZLED),
    ]
    pipeline = nv.acc_pipeline(step, specs, steps, config.max_concurrent_steps, acc_shape)
    acc = pipeline(w_gmem.at[rows], x_gmem)
    out = o_gmem.at[:, rows] if splits == 1 else o_gmem.at[jax.lax.axis_index("k"), :, rows]
    # The pipeline's buffers are free again here, so the reduction scratch reuses their SMEM.
    pl.run_scoped(
      lambda red: epilogue(acc, red, scale_gmem.at[rows], out),
      plgpu.SMEM((4, tn, 8 * nt), jnp.float32),
    )

  call = nv.launch(kernel, nv.gemv_out_type(m, n, splits), math.ceil(n / tn), splits)
  # Bitcast and row-major reshapes: free in XLA; TMA gets one 128-byte line per block row.
  out = call(
    x_MK.astype(jnp.bfloat16).reshape(m, k // 64, 64),
    jax.lax.bitcast_convert_type(w.codes_NK, jnp.uint8).reshape(n, k // TILE_K, TILE_K),
    w.scale_N.astype(jnp.float32),
  )
  return out if splits == 1 else out.sum(0).astype(jnp.bfloat16)


# ------------------------------------------------------------------------------------------------
# Public entry points.


# One XLA reference and fallback for every quantized type: both only dequantize.
reference = nv.reference
xla_matmul = nv.xla_matmul


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


def supported(x_MK: jax.Array, w: FP8Weight, config: TuningConfig | None = None) -> bool:
  n = w.shape[1]
  check = lambda m, k: (config or default_config(m, k, n)).check(m, k, n)  # noqa: E731
  return nv.kernel_takes(x_MK, w.codes_NK.ndim == 2, check)


def _kernel_matmul(x_MK: jax.Array, w: FP8Weight, config: TuningConfig | None) -> jax.Array:
  m, k = x_MK.shape
  return _mosaic_matmul(x_MK, w, config or default_config(m, k, w.shape[1]))


@functools.partial(jax.jit, static_argnames=("config", "implementation"))
def fp8_matmul(x_MK: jax.Array, w: FP8Weight, *, config=None, implementation=None) -> jax.Array:
  """x [M, K] @ w (K, N) -> bf16 [M, N]; the Mosaic GPU kernel where it applies, else XLA (see
  `nvfp4_gemv.use_kernel` for `implementation`)."""
  _check_operands(x_MK, w)
  return nv.dispatch(
    x_MK, w, config, implementation, supported=supported, fallback=xla_matmul, kernel=_kernel_matmul
  )


# ------------------------------------------------------------------------------------------------
# Benchmark.


def random_weight(key, k: int, n: int, copies: int = 1) -> FP8Weight:
  """Uniformly random non-NaN codes (every exponent, subnormals included), column scales in
  [2^-10, 2^-8] so outputs of unit-variance x stay near 1."""
  k1, k2 = jax.random.split(key)
  lead = (copies,) if copies > 1 else ()
  bits = jax.random.bits(k1, (*lead, n, k), jnp.uint8)
  bits = jnp.where((bits & 0x7F) == 0x7F, bits ^ 1, bits)  # 0x7F / 0xFF are E4M3 NaN
  scale = jnp.exp2(jax.random.uniform(k2, (*lead, n), minval=-10, maxval=-8))
  return FP8Weight(jax.lax.bitcast_convert_type(bits, jnp.float8_e4m3fn), scale)


def _timed_rows(k: int, n: int, m: int, w_list, dense_list, configs, iterations: int):
  """Kernel rows for one (M, K, N): compile time, error against `reference`, CUPTI time over the
  weight copies; XLA's bf16 dot and the XLA FP8 fallback timed on the same copies."""
  copies = len(w_list)
  x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
  ref = reference(x, w_list[0])
  xla = jax.jit(lambda x, ds: [jnp.dot(x, d) for d in ds])
  t_xla = statistics.median(nv.call_times_us(xla, (x, dense_list), copies, iterations))
  fallback = jax.jit(lambda x, ws: [xla_matmul(x, w) for w in ws])
  t_fallback = statistics.median(nv.call_times_us(fallback, (x, w_list), copies, iterations))
  for config in configs or [default_config(m, k, n)]:
    row = dict(m=m, k=k, n=n, config=config, xla_us=t_xla, fallback_us=t_fallback)
    try:
      one = jax.jit(functools.partial(fp8_matmul, config=config, implementation="mosaic"))
      t0 = time.perf_counter()
      compiled = one.lower(x, w_list[0]).compile()
      row["compile_s"] = time.perf_counter() - t0
      row["rel_err"] = nv.rel_err(compiled(x, w_list[0]), ref)
      chain = jax.jit(
        lambda x, ws, c=config: [fp8_matmul(x, w, config=c, implementation="mosaic") for w in ws]
      )
      row["us"] = statistics.median(nv.call_times_us(chain, (x, w_list), copies, iterations))
    except Exception as e:  # noqa: BLE001 -- report the failure in the table and keep going
      row["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
      print(f"FAILED m={m} k={k} n={n} {config}: {row['error']}", file=sys.stderr)
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
      f"{100 * tbs / nv.COPY_CEILING_TBS:.0f}%",
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
    dense = jax.random.normal(jax.random.key(1), (copies, k, n), jnp.bfloat16)
    dense_list = [dense[c] for c in range(copies)]
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
      case = functools.partial(nv.check_against, fp8_matmul, reference, x, w, config)
      ok &= nv.check_case(f"check M={m} K={k} N={n} {config}", case)
  return ok


def main(argv=None) -> None:
  args = nv.bench_parser(__doc__).parse_args(argv)
  nv.bench_start()
  if args.mode in ("check", "all") and not check([int(m) for m in args.check_ms.split(",")]):
    print("CHECK FAILED", flush=True)
  if args.mode == "check":
    return
  configs = nv.bench_configs(args, TuningConfig)
  shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
  print(TABLE_HEAD, flush=True)
  rows = bench(shapes, [int(m) for m in args.ms.split(",")], args.copies, args.iterations, configs)
  print("\n" + TABLE_HEAD)
  print("\n".join(_format_row(r) for r in rows))


if __name__ == "__main__":
  main()
