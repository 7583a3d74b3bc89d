"""EXL3 trellis decode for the GEMV kernel: one lane's trellis words -> its mma A fragments, as
straight-line PTX (`DecodeProgram.ptx`, inlined by kernels_pallas/exl3_gemv.py) and as numpy
(`DecodeProgram.run_np`, the CPU model and tests run the very same instructions).

A tile's position t = 8 lane + e is element (2q + {0,1,8,9}, g + {0,8}) of the 16x16 tile (q =
lane % 4, g = lane / 4): the m16n8k16 A fragment of W_hat^T, so each lane decodes its own 8
weights. Its 8 states are 16-bit windows of the tile's bitstream inside 2 words (K <= 4) or 3
(K >= 5). For K = 4 and 8 every lane's windows sit at the same bit offsets (compile-time shifts);
for other K the lane's words are first funnel-shifted so its stream starts at bit 0. A window at
offset 0, 8 or 16 of some 32-bit view costs one op (shr, prmt, and); `_extract` adds
funnel-shifted views where one covers two or more windows, and cuts a byte-aligned window that
straddles two words with one prmt of the word and a clean state cut from the next word
(`_cut_straddle`: K = 4's window 1, K = 8's windows 0 and 4). K = 4: 10 ops for 8 states; K = 8: 8.
  mul1: hash = state * 0x83DCD12D; `dp4a(hash, 0x01010101, 0x6400)` is the fp16 bits of h =
1024 + byte_sum, exact; prmt packs two h per A register. fl16(h * a + b) is never formed: the mma
sums h x' and the epilogue applies a (and XLA b * sum(x')), so the kernel uses the codebook's exact
affine value. 3INST / MCG: (hash & 0x8FFF8FFF) ^ 0x3B603B60 is two fp16 halves whose sum is the
value; both go into the mma as two k entries against the same x', so the sum is never rounded.
Layout of the trellis: docs/design.md, "Quantized weights"; decode costs measured:
docs/benchmarks.md, "Kernel notes moved from the code".
"""

import dataclasses
import functools
import math

import numpy as np

from kernels_pallas import gemv_common as gemv
from specdec.quant.exl3.codebook import (
  HALF_PAIR_MASK,
  HALF_PAIR_XOR,
  INST3_ADD,
  INST3_MULT,
  MCG_MULT,
  MUL1_MULT,
  Codebook,
)

TILE_WEIGHTS = 256
AND_XOR_LUT = (0xF0 & 0xCC) ^ 0xAA  # lop3 truth table of (a & b) ^ c
MUL1_H_BASE = 0x6400  # fp16 bits of 1024: + byte_sum (<= 1020) is exactly 1024 + byte_sum


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


NUMPY_SEMANTICS = {
  "shf.l.clamp.b32": _funnel_left,
  "shl.b32": lambda a, n: _u32(np.asarray(a, np.uint64) << np.uint64(np.minimum(n, 32))),
  "shr.b32": lambda a, n: _u32(np.asarray(a, np.uint64) >> np.uint64(min(n, 32))),
  "and.b32": lambda a, b: _u32(np.asarray(a, np.uint64) & np.uint64(b)),
  "lop3.b32": _lop3,
  "prmt.b32": lambda a, b, sel: gemv.prmt_np(a, np.broadcast_to(_u32(b), np.shape(a)), sel),
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
      env[d] = NUMPY_SEMANTICS[op](*(env[s] if isinstance(s, str) else s for s in srcs))
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
    hashes = [b.emit("mad.lo.u32", s, INST3_MULT, INST3_ADD) for s in states]
  halves = [b.emit("lop3.b32", x, HALF_PAIR_MASK, HALF_PAIR_XOR, AND_XOR_LUT) for x in hashes]
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
