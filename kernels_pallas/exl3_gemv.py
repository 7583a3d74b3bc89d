"""EXL3 trellis GEMV / skinny GEMM for Hopper: x [M, K] bf16 @ W -> [M, N], M = 1..16, K bits 1..8.

W = diag(suh) . H . W_hat . H . diag(svh) (specdec/quant/exl3/weight.py). The rotations act on
[M, 128-blocks] and are XLA ops: x' = had(x * suh) goes in as fp16, the kernel computes
x' @ W_hat straight from the trellis, and had(y') * svh (+ bias) comes after. Each rotation is a
multiply and a row sum (`had_activations`), not a dot, so XLA can fuse it with the scaling and
casts beside it: 7.4-11.3% off the 8B EXL3 decode step (docs/benchmarks.md, session 9).
Prefill (M > 16) reconstructs W and lets XLA multiply (`EXL3Weight.dense_matmul`).
`EXL3Weight.matmul` dispatches here on a GPU for bf16 x: see "In the model" below for the gate
that decided it.

Backend: Mosaic GPU (`plgpu.kernel` + `plgpu.emit_pipeline`, TMA into SMEM), the per-tile decode
written as straight-line PTX through `plgpu.inline_mgpu`; no Triton fallback exists.

Structure. One CTA = one warpgroup owning `tiles_n` 16-column tiles of W_hat. K streams through a
TMA pipeline in steps of `tiles_k` 16-row tiles: per step the trellis block
[tiles_k, tiles_n, 16 K] int16 (the checkpoint's own layout, unpermuted) and x' [tiles_k, M, 16].
Warp w takes k-tiles w, w + 4, ... of the step for every n-tile, so each x' fragment is read by
one warp; the four warps' f32 mma partials are summed through SMEM at the end, exactly as
nvfp4_gemv does (its epilogue, SMEM loads and numpy lane model are reused from there). The last
CTA's columns are clamped to end at N; split_k > 1 writes f32 partials that XLA sums.

Decode. A tile's position t = 8 lane + e is element (2q + {0,1,8,9}, g + {0,8}) of the 16x16 tile
(q = lane % 4, g = lane / 4): exactly the m16n8k16 A fragment of W_hat^T, so with the weight as A
and the tokens as B (n = 8 tokens per mma, two mma for M > 8) each lane decodes its own 8 weights
and nothing is shuffled. Its 8 states are 16-bit windows of the tile's bitstream inside 2 words
(K <= 4) or 3 (K >= 5). For K = 4 and 8 every lane's windows sit at the same bit offsets, so
they are cut out with compile-time shifts; for other K the lane's words are first funnel-shifted
so its stream starts at bit 0. A window whose offset inside some 32-bit view is 0, 8 or 16 costs
one op (shr, prmt, and); `_extract` adds funnel-shifted views where one covers two or more
windows, and cuts a byte-aligned window that straddles two words with one prmt of the word and a
state already cut from the next word, whose bytes 2 and 3 are the zeros it needs (`_cut_straddle`:
K = 4's window 1, K = 8's windows 0 and 4; no other K has one). K = 4: 10 ops for 8 states
instead of 13; K = 8: 8.
  mul1 (the default codebook): hash = state * 0x83DCD12D; `dp4a(hash, 0x01010101, 0x6400)` is the
fp16 bit pattern of h = 1024 + byte_sum, exact; prmt packs two h into the A register. The value
fl16(h * a + b) is never formed: the mma sums h x' and the epilogue applies a (in the kernel) and
b * sum(x') (in XLA). So the kernel uses the codebook's exact affine value, off the fp16-rounded
one by at most half an fp16 ulp per weight. Per weight (K = 4): 1.25 extraction ops + IMUL + DP4A +
0.5 PRMT.
  3INST / MCG: hash -> (hash & 0x8FFF8FFF) ^ 0x3B603B60 is two fp16 halves whose sum is the value.
Both halves go into the mma as two k entries against the same x' (x' is duplicated in the
fragment layout), so the sum is never rounded to fp16 either; twice the mma, no add.

Measured on the H200 (2026-11-30, jax 0.11.2, CUPTI kernel time, median of 5 runs over 4 weight
copies so L2 holds none; `PYTHONPATH=. python3 -m kernels_pallas.exl3_gemv --mode bench`; mul1,
random trellis; config tiles_n/tiles_k/stages/split_k = 2/16/4/1 for K <= 4 and 2/8/4/1 above, the
defaults of that run; TB/s = K N bits / 8 bytes / time; XLA = its bf16 dot on a dense weight in the
same run: 105.6, 106.7, 108.1, 110.9 us at M = 1, 4, 8, 16; compile 0.4-0.6 s per kernel),
before the straddle cut ("Straddle" below: 1-4% faster at K = 4):

  in x out 8192x28672   M = 1         M = 4         M = 8         M = 16
  K = 2                 56.7 us 1.04  59.5    0.99  63.8    0.92  81.8    0.72 TB/s
  K = 3                 64.7    1.36  67.8    1.30  70.0    1.26  90.7    0.97
  K = 4                 53.9    2.18  58.1    2.02  64.8    1.81  83.3    1.41
  K = 5                 76.0    1.93  75.9    1.93  84.5    1.74  102.3   1.43
  K = 6                 74.8    2.35  77.6    2.27  81.7    2.16  101.6   1.73
  K = 7                 78.3    2.63  82.2    2.50  90.5    2.27  109.3   1.88
  K = 8                 64.1    3.66  69.9    3.36  75.2    3.13  104.3   2.25
  K = 4, whole op (kernel + XLA's rotations and affine): 61.7, 68.1, 78.3, 100.0 us.

K = 4, M = 1 by config (same runs): 1/16/4/1 63.9 us, 1/32/4/1 54.6, 2/16/4/1 54.2, 2/32/4/1 50.4
(2.33 TB/s), 4/16/4/1 57.2, 4/32/4/1 56.8, 7/16/4/1 50.4, 2/32/3/1 51.8, 2/64/3/1 50.0 (2.35 TB/s,
the best), 3/32/3/1 53.4, 3/64/3/1 55.9, 7/32/3/1 51.9; at M = 16: 2/32/3/1 88.7, 3/32/3/1 76.7.
5120x17408 with 11/16/4/4 (that run's default, split K): K = 4 M = 1 28.5 us 1.56 TB/s (XLA 41.9
us; op 35.3 us), K = 2 M = 1 21.4 us, M = 16 28.9 us (XLA 46.5). `default_config` now picks
2/32/4/1 on 8192x28672 (measured above) and 3/32/4/1 on 5120x17408 (not measured).

Against issue #8: faster than XLA's bf16 dot for every K <= 4 and M (1.22x at K = 3, M = 16 to
2.11x); compile well under 20 s; the 2.6 TB/s bar at K = 4, M = 1 (45 us) is NOT met: 50.0 us;
49.2 us (2.39 TB/s) at 2/32/4/1 with the straddle cut.

What bounds it. Not HBM below K = 8: K = 2, 3 and 4 take 54-65 us for the same 235M weights
whatever their bytes, i.e. about 16.7 weights per cycle per SM at 1.98 GHz. The decode program
for K = 4 (nvdisasm of ptxas 13.0's sm_90 code for it): 30 instructions per 8 weights (31 before
the straddle cut; K = 8: 28, from 30), 8 IMAD + 8 IDP4A on the FMA pipe and 7 PRMT + 4 SHF + 3
LOP3 on the ALU pipe (64 lanes per cycle per SM each; before: 6 PRMT + 5 SHF + 4 LOP3), plus 2
LDS and one HMMA per lane. At 16.7 weights per cycle (31 instructions) both pipes run near 50% and
issue near 55%, so neither pipe is saturated: latency or per-step overhead is, as the sweep says
(doubling the k-tiles per step took 1 n-tile CTAs from 63.9 to 54.6 us and 2 n-tile CTAs from
54.2 to 50.4 us). K = 8 runs at 86% of the 4.24 TB/s copy ceiling. M > 8 doubles the mma and x'
fragment work (two token tiles): +55% at K = 4. Next levers, unmeasured: the kernel's register
count and occupancy (read them first), releasing each slot per warp instead of a warpgroup
barrier per step, and more warpgroups per CTA.

Straddle (2026-11-30, same bench; 8192x28672, K = 4 mul1, 2/32/4/1). Nsight Compute before it:
52 us, 35.5M warp instructions (38.6 per tile and warp: 31 decode + 2 LDS + 1 HMMA + ~4.6 of
per-step overhead), issue slots 72.6% busy, 48 registers, occupancy 29%: issue bound. The cut
takes the main loop (16 tiles per warp and step, ptxas 13.0 sm_90a) from 617 to 601 instructions
at 48 registers (tiles_k = 64 would halve its ~70 per-step ones: TMA issue, barrier, mbarrier
wait), and the kernel from 51.0 to 49.2 us at M = 1 (2.30 -> 2.39 TB/s); M = 4, 8, 16: 52.1 ->
51.7, 58.8 -> 58.2, 85.5 -> 84.8 us. The 2.6 TB/s bar is still not met. Tried with it and
removed: mul1 with one h per A register and twice the HMMA (no packing prmt, decode 30 -> 26, loop
553) was slower (M = 1, 4, 8: 51.4, 53.0, 59.1 us; without the cut 51.6, 54.5, 59.2; K = 8 M = 1:
60.9 against 60.5 for neither; its doubled x' put M = 16 at tiles_k 32 over the SMEM limit), and
adding n-tile pairs' words interleaved for one LDS.64 per two tiles (loop 537) gave 48.7, 51.8,
57.0 us, within noise of the cut alone and needing a load-time repack the model does not have.
  Not reachable: one op per state at K = 4 (the old lead, a load-time repack, 31 -> 28). A clean
16-bit state in one op (shr 16, and 0xffff, prmt with a zero source) needs its two bytes
byte-aligned in registers; a lane's 8 windows need all 10 adjacent nibble pairs of its 11 nibbles
as bytes, the stored 44 bits hold at most 5 of them in any permutation (no nibble is stored
twice), and one shift makes at most 4 more: 8 cuts + 2 = 10 ops, which the straddle cut reaches
in the stream's own layout. IMAD and DP4A need the clean state (x * M mod 2^32 of a dirty x
differs in its high bytes).

In the model (`python -m experiments.check_quant_kernel --format=exl3_4`): M = 8 logits through
the kernel differ from the dequantized-bf16 twin by at most 0.094-0.125 (of max |logit| 11.5), the
same as NVFP4's kernel against its twin. 2026-11-30, zoo target quantized to EXL3 K = 4 on the CPU
(experiments/export_quant_zoo), 3 HumanEval prompts, ngram k = 4: speculative tokens equalled the
same-shape baseline on 3 of 3 through the kernel (and 3 of 3 through the twin); plain greedy through
the kernel equalled the twin's on 3 of 3; speculative equalled plain greedy on 2 of 3 on both paths
(the bf16 width-5 rounding the sweep's gate allows for). Hence the dispatch.

Testing without a GPU. `_step` is written once against the small ops interface of nvfp4_gemv;
the decode is a `DecodeProgram` that both prints as PTX and runs on numpy. `emulate()` runs the
kernel's own step and epilogue on numpy lanes; the CPU tests check it against the jnp reference,
the states against specdec.quant.exl3's unpacking for every K, and that the kernel lowers for
the cuda platform (`jax.export`). `-m gpu` tests run the kernel.
"""

import argparse
import dataclasses
import functools
import math
import statistics
import sys
import time

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np

from kernels_pallas import nvfp4_gemv as nv
from specdec.quant.exl3.codebook import (
  _HALF_PAIR_MASK,
  _HALF_PAIR_XOR,
  _INST3_ADD,
  _INST3_MULT,
  _MUL1_BIAS_BITS,
  _MUL1_SCALE_BITS,
  MCG_MULT,
  MUL1_MULT,
  Codebook,
)
from specdec.quant.exl3.hadamard import had_activations
from specdec.quant.exl3.weight import EXL3Weight

TILE = 16  # rows and columns of one trellis tile
TILE_WEIGHTS = 256
WARPS = 4
M_MAX = 16
MAX_BITS = 8
NUM_SMS = 132
SMEM_BYTES = 227 * 1024  # the most one CTA may take on the H200
MUL1_SCALE = float(np.array(_MUL1_SCALE_BITS, np.uint16).view(np.float16))
MUL1_BIAS = float(np.array(_MUL1_BIAS_BITS, np.uint16).view(np.float16))
AND_XOR_LUT = (0xF0 & 0xCC) ^ 0xAA  # lop3 truth table of (a & b) ^ c
MUL1_H_BASE = 0x6400  # fp16 bits of 1024: + byte_sum (<= 1020) is exactly 1024 + byte_sum

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
  fit. Measured on 8192x28672, K = 4, M = 1 (module docstring): balance and fewer, larger steps
  both paid; the one split-K point measured (5120x17408, split 4) was the slowest per byte."""
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
# Decode: one lane's trellis words -> its mma A fragments, as straight-line PTX and as numpy.


def lane_start_bit(lane, bits: int):
  """Stream bit where the lane's first state window starts, plus one tile so it is >= 0."""
  return lane * (8 * bits) + (bits - 16 + TILE_WEIGHTS * bits)


def words_per_lane(bits: int) -> int:
  """32-bit words that hold every lane's 8 windows (7 K + 16 bits from its start bit)."""
  offsets = lane_start_bit(np.arange(32), bits) % 32
  return int(np.max((offsets + 7 * bits + 16 + 31) // 32))


def uniform_offset(bits: int) -> bool:
  """Whether all lanes' windows start at the same bit of a word (the lane stride 8K % 32 == 0)."""
  return 8 * bits % 32 == 0


def _u32(v) -> np.ndarray:
  return (np.asarray(v, np.uint64) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _funnel_left(lo, hi, n):
  """shf.l.clamp.b32: the high word of ({hi, lo} << min(n, 32)) as 64 bits."""
  n = np.minimum(np.asarray(n, np.uint64), 32)
  v = (np.asarray(hi, np.uint64) << np.uint64(32)) | np.asarray(lo, np.uint64)
  return _u32((v << n) >> np.uint64(32))


def _dp4a(a, b, c):
  a, b = np.asarray(a, np.uint64), np.uint64(b)
  total = np.asarray(c, np.uint64)
  for s in range(0, 32, 8):
    total = total + ((a >> np.uint64(s)) & np.uint64(255)) * ((b >> np.uint64(s)) & np.uint64(255))
  return _u32(total)


def _lop3(a, b, c, lut: int):
  """Bit i of the result is bit (a_i b_i c_i) of `lut`, read as a 3-bit index."""
  a, b, c = (np.asarray(_u32(v), np.uint32) for v in (a, b, c))
  out = np.zeros(np.broadcast(a, b, c).shape, np.uint32)
  for idx in range(8):
    if lut >> idx & 1:
      sel = [v if idx >> (2 - n) & 1 else ~v for n, v in enumerate((a, b, c))]
      out |= sel[0] & sel[1] & sel[2]
  return out


_NUMPY_SEMANTICS = {
  "shf.l.clamp.b32": _funnel_left,
  "shl.b32": lambda a, n: _u32(np.asarray(a, np.uint64) << np.uint64(np.minimum(n, 32))),
  "shr.b32": lambda a, n: _u32(np.asarray(a, np.uint64) >> np.uint64(min(n, 32))),
  "and.b32": lambda a, b: _u32(np.asarray(a, np.uint64) & np.uint64(b)),
  "lop3.b32": _lop3,
  "prmt.b32": lambda a, b, sel: nv.prmt_np(a, np.broadcast_to(_u32(b), np.shape(a)), sel),
  "mul.lo.u32": lambda a, b: _u32(np.asarray(a, np.uint64) * np.uint64(b)),
  "mad.lo.u32": lambda a, b, c: _u32(np.asarray(a, np.uint64) * np.uint64(b) + np.uint64(c)),
  "dp4a.u32.u32": _dp4a,
}


@dataclasses.dataclass(frozen=True)
class DecodeProgram:
  """Straight-line code over named 32-bit registers. Inputs: the lane's words w0.. (stream order)
  and, unless every lane shares one bit offset, that offset `o`. `states` name the 8 windows."""

  n_words: int
  runtime_offset: bool
  instrs: tuple[tuple[str, str, tuple], ...]  # (opcode, destination, sources)
  states: tuple[str, ...]
  outputs: tuple[str, ...]  # A-fragment registers, 4 per mma

  @property
  def inputs(self) -> tuple[str, ...]:
    return tuple(f"w{j}" for j in range(self.n_words)) + (("o",) if self.runtime_offset else ())

  @property
  def n_ops(self) -> int:
    return len(self.instrs)

  def ptx(self) -> str:
    names = {r: f"${i}" for i, r in enumerate(self.outputs)}
    names |= {r: f"${len(self.outputs) + i}" for i, r in enumerate(self.inputs)}
    temps = sorted({d for _, d, _ in self.instrs} - set(names), key=lambda r: int(r[1:]))

    def operand(s):
      return f"{s:#x}" if isinstance(s, int) else names.get(s, s)

    lines = [f".reg .b32 {', '.join(temps)};"] if temps else []
    for op, d, srcs in self.instrs:
      lines.append(f"{op} {operand(d)}, {', '.join(operand(s) for s in srcs)};")
    return "{\n" + "\n".join(lines) + "\n}"

  def run_np(self, inputs) -> dict[str, np.ndarray]:
    """Every register's value for these input arrays (in `inputs` order)."""
    env = {r: _u32(v) for r, v in zip(self.inputs, inputs, strict=True)}
    for op, d, srcs in self.instrs:
      env[d] = _NUMPY_SEMANTICS[op](*(env[s] if isinstance(s, str) else s for s in srcs))
    return env


class _Builder:
  def __init__(self):
    self.instrs: list[tuple[str, str, tuple]] = []

  def emit(self, op: str, *srcs) -> str:
    d = f"t{len(self.instrs)}"
    self.instrs.append((op, d, srcs))
    return d


_ONE_OP = (0, 8, 16)  # window offsets inside a 32-bit view that one shr / prmt / and cuts out


def _lane_stream(b: _Builder, bits: int) -> tuple[list[str], int]:
  """Registers holding the lane's stream from a word boundary, and its first window's offset.
  Where lanes' offsets differ they are funnel-shifted out, so the stream starts at bit 0."""
  n_words = words_per_lane(bits)
  raw = [f"w{j}" for j in range(n_words)]
  if uniform_offset(bits):
    return raw, int(lane_start_bit(0, bits)) % 32
  base = [
    b.emit("shf.l.clamp.b32", raw[j + 1], raw[j], "o")
    if j + 1 < n_words
    else b.emit("shl.b32", raw[j], "o")
    for j in range(math.ceil((7 * bits + 16) / 32))
  ]
  return base, 0


def _view_at(b: _Builder, base: list[str], a: int) -> str:
  """A register holding stream bits [a, a + 32) (zeros past the last base word)."""
  j, r = divmod(a, 32)
  if r == 0:
    return base[j]
  if j + 1 < len(base):
    return b.emit("shf.l.clamp.b32", base[j + 1], base[j], r)
  return b.emit("shl.b32", base[j], r)


def _one_op(p: int, a: int) -> bool:
  return p - a in _ONE_OP


def _add_views(positions: list[int], views: dict[int, str], view_at) -> dict[int, str]:
  """Adds the view that makes the most two-op windows one-op, while that saves an op."""
  while True:
    costly = [p for p in positions if not any(_one_op(p, a) for a in views)]
    gains = {a: sum(_one_op(p, a) for p in costly) for p in costly for a in (p, p - 8, p - 16)}
    gains = {a: n for a, n in gains.items() if a >= 0 and a not in views}
    a = max(sorted(gains), key=gains.__getitem__, default=None)
    if a is None or gains[a] < 2:
      return views
    views[a] = view_at(a)


def _cut(b: _Builder, views: dict[int, str], p: int, view_at) -> str:
  """The zero-extended 16-bit window at stream bit p."""
  aligned = [a for a in sorted(views) if _one_op(p, a)]
  if aligned:
    v, r = views[aligned[0]], p - aligned[0]
    if r == 0:
      return b.emit("shr.b32", v, 16)
    if r == 8:
      return b.emit("prmt.b32", v, 0, 0x4421)  # bytes 1, 2 and two zero bytes
    return b.emit("and.b32", v, 0xFFFF)
  inside = [a for a in sorted(views) if 0 <= p - a <= 16]
  if inside:
    return b.emit("and.b32", b.emit("shr.b32", views[inside[0]], 16 - (p - inside[0])), 0xFFFF)
  return b.emit("and.b32", view_at(p - 16), 0xFFFF)  # straddles two words: a throwaway view


def _view_bytes(views: dict[int, str]) -> dict[str, dict[int, int]]:
  """Byte lane -> stream byte of every byte-aligned view (stream bit a is the view's bit 31)."""
  return {v: {k: a // 8 + 3 - k for k in range(4)} for a, v in views.items() if a % 8 == 0}


def _cut_straddle(b: _Builder, sources: dict[str, dict[int, int]], clean: list[str], p: int):
  """The byte-aligned window at p as one prmt: its two bytes from a register and a clean state
  (a window cut earlier, bytes 2 and 3 zero) that supplies the zero bytes; None if none has them.
  In the stream's own layout this is K = 4's window 1 and K = 8's windows 0 and 4: each takes its
  high byte from one word and its low byte from the state cut at the start of the next."""
  hi, lo = p // 8, p // 8 + 1
  for z in clean:
    for r, r_bytes in sources.items():
      pool = {**{4 + k: sb for k, sb in sources[z].items()}, **r_bytes}  # prmt's 8-byte index
      at = {sb: i for i, sb in sorted(pool.items(), reverse=True)}
      if hi in at and lo in at:
        return b.emit("prmt.b32", r, z, 0x6600 | at[hi] << 4 | at[lo])  # zeros: z's byte 2
  return None


def _extract(b: _Builder, bits: int) -> list[str]:
  """The lane's 8 state registers. Byte-aligned windows no view cuts in one op (they straddle
  two words) are cut last, each by `_cut_straddle` where a clean state supplies its zeros."""
  base, first = _lane_stream(b, bits)
  view_at = functools.partial(_view_at, b, base)
  positions = [first + e * bits for e in range(8)]
  views = _add_views(positions, {32 * j: w for j, w in enumerate(base)}, view_at)
  deferred = [p for p in positions if p % 8 == 0 and not any(_one_op(p, a) for a in views)]
  cuts = {p: _cut(b, views, p, view_at) for p in positions if p not in deferred}
  sources = _view_bytes(views)
  for c, r in cuts.items():
    if c % 8 == 0:  # a clean state: stream bytes c / 8 (lane 1) and c / 8 + 1 (lane 0), zeros
      sources[r] = {0: c // 8 + 1, 1: c // 8, 2: -1, 3: -1}
  clean = [r for c, r in cuts.items() if c % 8 == 0]
  for p in deferred:
    cuts[p] = _cut_straddle(b, sources, clean, p) or _cut(b, views, p, view_at)
  return [cuts[p] for p in positions]


def _codebook_stage(b: _Builder, states: list[str], codebook: Codebook) -> list[str]:
  """States -> A registers. Lane element e sits at (row g + 8 [e >= 4], k 2q + [e odd] + 8 [e in
  2, 3, 6, 7]); an m16n8k16 A fragment is (row g, k 2q..), (g + 8, 2q..), (g, 2q + 8..), (g + 8,
  2q + 8..), so the registers are (e0, e1), (e4, e5), (e2, e3), (e6, e7)."""
  if codebook == Codebook.MUL1:
    h = [
      b.emit("dp4a.u32.u32", b.emit("mul.lo.u32", s, MUL1_MULT), 0x01010101, MUL1_H_BASE)
      for s in states
    ]
    return [b.emit("prmt.b32", h[e], h[e + 1], 0x5410) for e in (0, 4, 2, 6)]
  if codebook == Codebook.MCG:
    hashes = [b.emit("mul.lo.u32", s, MCG_MULT) for s in states]
  else:
    hashes = [b.emit("mad.lo.u32", s, _INST3_MULT, _INST3_ADD) for s in states]
  halves = [b.emit("lop3.b32", x, _HALF_PAIR_MASK, _HALF_PAIR_XOR, AND_XOR_LUT) for x in hashes]
  # Each register is one weight's two halves, i.e. two k slots holding the same x' value. mma 1
  # takes k 2q (rows g, g + 8) and 2q + 1; mma 2 takes k 2q + 8 and 2q + 9.
  return [halves[e] for e in (0, 4, 1, 5, 2, 6, 3, 7)]


@functools.cache
def decode_program(bits: int, codebook: Codebook) -> DecodeProgram:
  b = _Builder()
  states = _extract(b, bits)
  outputs = _codebook_stage(b, states, Codebook(codebook))
  return DecodeProgram(
    words_per_lane(bits), not uniform_offset(bits), tuple(b.instrs), tuple(states), tuple(outputs)
  )


def lane_words(bits: int) -> tuple[np.ndarray, np.ndarray]:
  """Per lane: the tile word index of each of its words [32, n_words], and its bit offset [32]."""
  start = lane_start_bit(np.arange(32), bits)
  idx = ((start[:, None] >> 5) + np.arange(words_per_lane(bits))) % (8 * bits)
  return idx, start % 32


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
  warp, g, q = nv._lanes(ops.tid)
  tn, program = s.config.tiles_n, decode_program(s.bits, s.codebook)
  start = lane_start_bit(ops.tid & 31, s.bits)
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


class _NumpyOps(nv._NumpyOps):
  def __init__(self, scale: float):
    super().__init__()
    self.scale = np.float32(scale)

  def mod(self, a, n: int):
    return np.asarray(a, np.uint32) % np.uint32(n)

  def decode(self, program: DecodeProgram, inputs):
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
        w_buf = nv._SmemImage(trellis[ks, n0 : n0 + tn], 0, swizzled=False)
        x_buf = nv._SmemImage(xf[ks], 0, swizzled=False)
        acc = _step(ops, s, w_buf, x_buf, acc)
      red = np.full((WARPS, tn * TILE, 8 * s.token_tiles), np.nan, np.float32)
      cols = out[split][:, n0 * TILE : (n0 + tn) * TILE]
      nv._epilogue(ops, tn, s.token_tiles, m, acc, red, None, cols, False)
  return out.sum(0)


# ------------------------------------------------------------------------------------------------
# MLIR emitter.


class _MlirOps(nv._MlirOps):
  def __init__(self, scale: float):
    super().__init__()
    self.scale = scale

  def mod(self, a, n: int):
    return nv._I32(nv._mlir()[1].remui(a.v, nv._I32._val(n)))

  def decode(self, program: DecodeProgram, inputs):
    args = [v.v if isinstance(v, nv._I32) else v for v in inputs]
    out = nv._mlir()[-1].inline_ptx(
      program.ptx(), *args, result_types=[self.i32] * len(program.outputs)
    )
    return list(out)

  def mma(self, a, b, c):
    return list(nv._mlir()[-1].inline_ptx(MMA_F16_PTX, *a, *b, *c, result_types=[self.f32] * 4))

  def out_factor(self, g_ref, row, divides):
    del g_ref, row, divides
    ir, arith, *_ = nv._mlir()
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
    acc = nv._acc_unpack(acc_fa, tn, s.token_tiles)
    w_buf, x_buf = (ops.smem(r, 0) for r in (w_ref, x_ref))  # unswizzled: the line is unused
    acc = _step(ops, s, w_buf, x_buf, acc)
    return nv._acc_pack(acc, acc_fa, tn, s.token_tiles)

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType(), plgpu.RefType()))
  def epilogue(ctx, acc_fa, red_ref, o_ref):
    del ctx
    ops = _MlirOps(scale)
    acc = nv._acc_unpack(acc_fa, tn, s.token_tiles)
    nv._epilogue(ops, tn, s.token_tiles, m, acc, red_ref, None, o_ref, False)

  def kernel(x_gmem, t_gmem, o_gmem):
    n0 = jnp.minimum(jax.lax.axis_index("n") * tn, n16 - tn)
    k0 = jax.lax.axis_index("k") * steps
    specs = [
      plgpu.BlockSpec((tk, tn, w16), lambda i: (k0 + i, 0, 0)),
      plgpu.BlockSpec((tk, m, xf_KMX.shape[-1]), lambda i: (k0 + i, 0, 0)),
    ]
    pipeline = nv.acc_pipeline(step, specs, steps, config.max_concurrent_steps, acc_shape)
    acc = pipeline(t_gmem.at[:, pl.ds(n0, tn)], x_gmem)
    out = o_gmem.at[jax.lax.axis_index("k"), :, pl.ds(n0 * TILE, tn * TILE)]
    # The pipeline's buffers are free again here, so the reduction scratch reuses their SMEM.
    pl.run_scoped(
      lambda red: epilogue(acc, red, out),
      plgpu.SMEM((WARPS, tn * TILE, 8 * s.token_tiles), jnp.float32),
    )

  out_type = jax.ShapeDtypeStruct((splits, m, n16 * TILE), jnp.float32)
  call = nv.launch(kernel, out_type, math.ceil(n16 / tn), splits)
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


def supported(x_MK: jax.Array, w: EXL3Weight, config: TuningConfig | None = None) -> bool:
  def check(m, _k):
    k16, n16, _ = w.trellis.shape
    _config_for(m, w, config).check(m, k16, n16, w.bits, w.codebook)

  return nv.kernel_takes(x_MK, w.trellis.ndim == 3, check)


def _kernel_matmul(x_MK: jax.Array, w: EXL3Weight, config: TuningConfig | None) -> jax.Array:
  n_in_p, n_out_p = w.padded_shape
  x_MK32 = jnp.pad(x_MK.astype(jnp.float32), ((0, 0), (0, n_in_p - x_MK.shape[1])))
  xh_MK = had_activations(x_MK32 * w.suh.astype(jnp.float32))
  y_MN = had_activations(inner_matmul(xh_MK, w, config)) * w.svh.astype(jnp.float32)
  if w.bias is not None:
    y_MN = y_MN + w.bias.astype(jnp.float32)
  return y_MN[:, : w.out_features].astype(x_MK.dtype)


@functools.partial(jax.jit, static_argnames=("config", "implementation"))
def exl3_matmul(x_MK: jax.Array, w: EXL3Weight, *, config=None, implementation=None) -> jax.Array:
  """x [M, in] @ W -> [M, out] in x's dtype; the Mosaic GPU kernel where it applies, else XLA (see
  `nvfp4_gemv.use_kernel` for `implementation`)."""
  return nv.dispatch(
    x_MK,
    w,
    config,
    implementation,
    supported=supported,
    fallback=lambda x_MK, w: w.dense_matmul(x_MK),
    kernel=_kernel_matmul,
  )


# ------------------------------------------------------------------------------------------------
# Benchmark and GPU check.


def random_weight(key, k: int, n: int, bits: int, codebook=Codebook.MUL1, bias=False) -> EXL3Weight:
  """Random words (every bitstream is a valid trellis: states are just its windows) and suh / svh
  of random sign and magnitude, as the quantizer leaves them."""
  keys = jax.random.split(key, 6)
  suh = jax.random.rademacher(keys[0], (k,)) * jax.random.uniform(
    keys[1], (k,), minval=0.01, maxval=0.1
  )
  svh = jax.random.rademacher(keys[2], (n,)) * jax.random.uniform(
    keys[3], (n,), minval=0.5, maxval=2
  )
  u16 = jax.random.bits(keys[4], (k // TILE, n // TILE, TILE * bits), jnp.uint16)
  return EXL3Weight(
    trellis=jax.lax.bitcast_convert_type(u16, jnp.int16),
    suh=suh.astype(jnp.float16),
    svh=svh.astype(jnp.float16),
    bias=jax.random.normal(keys[5], (n,), jnp.float16) if bias else None,
    codebook=Codebook(codebook),
    in_features=k,
    out_features=n,
  )


def _bench_kernel(x, ws: list[EXL3Weight], config: TuningConfig, iterations: int, op: bool):
  """Compile time and error of `inner_matmul`; CUPTI time of the kernel alone over the copies
  and, if `op`, of the whole `exl3_matmul`."""
  one = jax.jit(functools.partial(inner_matmul, config=config))
  t0 = time.perf_counter()
  compiled = one.lower(x, ws[0]).compile()
  row = {"compile_s": time.perf_counter() - t0}
  row["rel_err"] = nv.rel_err(compiled(x, ws[0]), inner_reference(x, ws[0]))
  s = _Shape(x.shape[0], ws[0].bits, ws[0].codebook, config)
  xf = x_fragments(x.astype(jnp.float16), s.codebook)
  chain = jax.jit(lambda xf, ts: [_mosaic_inner(xf, t, s) for t in ts])
  times = nv.call_times_us(chain, (xf, [w.trellis for w in ws]), len(ws), iterations)
  row["us"] = statistics.median(times)
  if op:  # what the model calls: the kernel plus XLA's rotations and mul1 affine around it
    full = jax.jit(lambda x, ws: [exl3_matmul(x, w, config=config) for w in ws])
    row["op_us"] = statistics.median(nv.call_times_us(full, (x, ws), len(ws), iterations))
  return row


def bench_shape(k, n, bits_list, ms, copies, iterations, codebook, configs, op_bits):
  """The kernel on `copies` weight sets (more than L2 holds) against XLA's bf16 dot."""
  rows = []
  dense = jax.random.normal(jax.random.key(1), (copies, k, n), jnp.bfloat16)
  dense_list = [dense[c] for c in range(copies)]
  xla_fn = jax.jit(lambda x, ds: [jnp.dot(x, d) for d in ds])
  xla_us = {}
  for m in ms:
    x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
    xla_us[m] = statistics.median(nv.call_times_us(xla_fn, (x, dense_list), copies, iterations))
  del dense, dense_list
  for bits in bits_list:
    ws = [random_weight(jax.random.key(bits * 8 + c), k, n, bits, codebook) for c in range(copies)]
    for m in ms:
      x = jax.random.normal(jax.random.key(m), (m, k), jnp.bfloat16)
      for config in configs or [default_config(m, k // TILE, n // TILE, bits, codebook)]:
        row = dict(m=m, k=k, n=n, bits=bits, config=config, xla_us=xla_us[m])
        row["xla_tbs"] = 2 * k * n / xla_us[m] / 1e6
        try:
          row |= _bench_kernel(x, ws, config, iterations, bits in op_bits)
          row["tbs"] = k * n * bits / 8 / row["us"] / 1e6
        except Exception as e:  # noqa: BLE001 -- report the failure in the table and keep going
          row["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
          print(f"FAILED {row}: {row['error']}", file=sys.stderr)
        rows.append(row)
        print(_format_row(row), flush=True)
    del ws
  return rows


def _cfg(c: TuningConfig) -> str:
  return f"{c.tiles_n}/{c.tiles_k}/{c.max_concurrent_steps}/{c.split_k}"


def _format_row(r: dict) -> str:
  head = f"K={r['bits']} M={r['m']:2d} {r['k']}x{r['n']} cfg={_cfg(r['config'])}"
  xla = f"XLA bf16 {r['xla_us']:7.1f} us {r['xla_tbs']:.2f} TB/s"
  if "error" in r:
    return f"{head} | FAILED | {xla}"
  return (
    f"{head} | {r['us']:6.1f} us {r['tbs']:.2f} TB/s {100 * r['tbs'] / nv.COPY_CEILING_TBS:3.0f}% "
    f"| op {r.get('op_us', math.nan):6.1f} us | {xla} | x{r['xla_us'] / r['us']:.2f} "
    f"| compile {r['compile_s']:.1f} s "
    f"| rel_err {r['rel_err']:.1e}"
  )


def _table(rows: list[dict]) -> None:
  print(
    "\n| K bits | M | in x out | tiles_n/tiles_k/stages/split_k | kernel us | TB/s | % of 4.24 "
    "| op us | XLA bf16 us | XLA / kernel | compile s |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    if "error" in r:
      print(f"| {r['bits']} | {r['m']} | {r['k']}x{r['n']} | {_cfg(r['config'])} | FAILED ||||||")
      continue
    print(
      f"| {r['bits']} | {r['m']} | {r['k']}x{r['n']} | {_cfg(r['config'])} | {r['us']:.1f} "
      f"| {r['tbs']:.2f} | {100 * r['tbs'] / nv.COPY_CEILING_TBS:.0f}% "
      f"| {r.get('op_us', math.nan):.1f} "
      f"| {r['xla_us']:.1f} | {r['xla_us'] / r['us']:.2f} | {r['compile_s']:.1f} |"
    )


def _check_errors(x, xh, w: EXL3Weight, config) -> tuple[bool, str]:
  inner = nv.rel_err(inner_matmul(xh, w, config), inner_reference(xh, w))
  full = nv.rel_err(exl3_matmul(x, w, config=config, implementation="mosaic"), reference(x, w))
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
          ok &= nv.check_case(
            f"check {codebook} K={bits} M={m} {config}",
            functools.partial(_check_errors, x, xh, w, config),
          )
  print(f"check {'passed' if ok else 'FAILED'}", flush=True)
  return ok


def _ints(s: str) -> list[int]:
  return [int(v) for v in s.split(",") if v]


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--mode", default="all", choices=["check", "bench", "all"])
  p.add_argument("--check_ms", default="1,9,16")
  p.add_argument("--check_bits", default="1,2,4,5,8")
  p.add_argument("--check_codebooks", default="mul1,3inst,mcg")
  p.add_argument("--shapes", default="8192x28672", help="in x out list")
  p.add_argument("--bits", default="2,3,4,5,6,7,8")
  p.add_argument("--ms", default="1,4,8,16")
  p.add_argument("--codebook", default="mul1")
  p.add_argument("--op_bits", default="4", help="K for which the whole op is timed too")
  p.add_argument("--copies", type=int, default=4, help="trellis sets cycled to defeat L2")
  p.add_argument("--iterations", type=int, default=5)
  p.add_argument("--tiles_n", default="", help="comma list to sweep (default: heuristic)")
  p.add_argument("--tiles_k", default="16")
  p.add_argument("--stages", default="4")
  p.add_argument("--split_k", default="1")
  args = p.parse_args(argv)
  nv.bench_start()
  if args.mode in ("check", "all"):
    if not check(_ints(args.check_ms), _ints(args.check_bits), args.check_codebooks.split(",")):
      sys.exit(1)
  if args.mode == "check":
    return
  configs = [
    TuningConfig(tn, tk, st, sk)
    for tn in _ints(args.tiles_n)
    for tk in _ints(args.tiles_k)
    for st in _ints(args.stages)
    for sk in _ints(args.split_k)
  ]
  rows = []
  for shape in args.shapes.split(","):
    k, n = map(int, shape.split("x"))
    rows += bench_shape(
      k,
      n,
      _ints(args.bits),
      _ints(args.ms),
      args.copies,
      args.iterations,
      Codebook(args.codebook),
      configs,
      _ints(args.op_bits),
    )
  _table(rows)


if __name__ == "__main__":
  main()
