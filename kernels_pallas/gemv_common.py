"""The Mosaic GPU GEMV machinery the weight-only kernels share (nvfp4_gemv, fp8_gemv, exl3_gemv).

A GEMV kernel here is one warpgroup per CTA on an (n, k) grid (`launch`): K streams through a TMA
pipeline (`acc_pipeline`) whose step runs through `plgpu.inline_mgpu` and keeps f32 `mma.sync`
m16n8k16 accumulators in registers, carried as a WGMMA-layout array (`acc_unpack` / `acc_pack`).
Inside a step the four warps split K, not rows; `epilogue` sums their partials through SMEM and
writes [M, N] (or f32 partials [split_k, M, N] that XLA sums: `gemv_out_type`). The last CTA's rows
are pulled back to end at N (`row_start`).

The per-step algorithm is written once against a small ops interface: `MlirOps` emits it as MLIR
and PTX, `NumpyOps` runs it on numpy arrays of the 128 thread values (SMEM images built with the
TMA 128-byte swizzle, `SmemImage`; mma fragments gathered per warp), so each kernel's `emulate()`
is a bit-faithful CPU model. A kernel subclasses both with its decode and its output factor.

Lane model: thread t is warp (t >> 5) & 3, row-in-block g = lane >> 2 and quad lane q = lane & 3
(`lanes`); with 128-byte code lines per weight row (`w_offset`), warps take 16-byte chunks w and
w + 4 (`k_chunk`), so 4 rows x 4 lanes of 8 bytes cover all 32 banks through the swizzle.
"""

import contextlib

import jax
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import ml_dtypes
import numpy as np

BLOCK_ROWS = 16  # rows of one mma.sync A operand
SWIZZLED = (plgpu.SwizzleTransform(128),)

MMA_PTX = (
  "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
  "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
)

# prmt selectors that pair x values (k, k + 4) from two words holding (k, k+1) and (k+4, k+5).
PAIR_LO, PAIR_HI = 0x5410, 0x7632


# ------------------------------------------------------------------------------------------------
# Lane model and SMEM addressing.


def swizzle(offset, line0):
  """SMEM byte offset -> where the 128B-swizzling TMA put it (line0 = slot base address >> 7)."""
  return offset ^ ((((offset >> 7) + line0) & 7) << 4)


def lanes(tid):
  lane = tid & 31
  return (tid >> 5) & 3, lane >> 2, lane & 3  # warp, row-in-block g, quad lane q


def k_chunk(warp, q):
  """(16-byte chunk of the 128-byte row line, 8-byte half) of a lane: its 16 k of the step are
  32 chunk + 16 half + [0, 16). Warps take chunks w and w + 4 so 4 rows x 4 lanes of 8 bytes cover
  all 32 banks through the swizzle."""
  return warp + ((q >> 1) << 2), q & 1


def w_offset(row, chunk, half):
  """Byte offset of a lane's 8 code bytes in a slot of 128-byte row lines."""
  return row * 128 + (chunk << 4) + (half << 3)


def checked_plan(config, default, m: int, k: int, n: int):
  """config (else default(m, k, n)) checked for the shape, with its row blocks per CTA and its
  token tiles of 8 (two above M = 8): the geometry every GEMV kernel here and its model share."""
  config = config or default(m, k, n)
  config.check(m, k, n)
  return config, config.tile_n // BLOCK_ROWS, 1 if m <= 8 else 2


def row_start(blk: int, n: int, tile_n: int):
  """First row of a CTA; the last CTA is pulled back to end at N (its overlap is recomputed)."""
  return min(blk * tile_n, n - tile_n)


def epilogue(ops, nb: int, nt: int, m: int, acc, red, g_ref, o_ref, divides: bool):
  """Sums the four warps' partials through SMEM; the warp w finishes row blocks b = w mod 4."""
  warp, g, q = lanes(ops.tid)
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


def bf16_bits_to_f32(bits) -> np.ndarray:
  return (np.asarray(bits, np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x) -> np.ndarray:
  return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)


def unpack_bf16x2(word) -> tuple[np.ndarray, np.ndarray]:
  w = np.asarray(word, np.uint32)
  return bf16_bits_to_f32(w & np.uint32(0xFFFF)), bf16_bits_to_f32(w >> np.uint32(16))


def prmt_np(a, b, sel: int) -> np.ndarray:
  pool = np.stack(
    [(np.asarray(x, np.uint32) >> np.uint32(8 * i)) & 0xFF for x in (a, b) for i in range(4)]
  )
  out = np.zeros_like(np.asarray(a, np.uint32))
  for i in range(4):
    out |= pool[(sel >> (4 * i)) & 7] << np.uint32(8 * i)
  return out


class SmemImage:
  """One pipeline slot as TMA leaves it: logical bytes, swizzled by absolute address when asked."""

  def __init__(self, logical: np.ndarray, base: int, swizzled: bool):
    flat = np.ascontiguousarray(logical).view(np.uint8).reshape(-1)
    self.line0 = (base >> 7) & 7
    self.bytes = np.zeros_like(flat)
    idx = np.arange(flat.size)
    self.bytes[swizzle(idx, self.line0) if swizzled else idx] = flat

  @classmethod
  def in_slot(cls, logical: np.ndarray, slot: int, swizzled: bool) -> "SmemImage":
    """Slot `slot` of a pipeline buffer of such slots, allocated 1024-aligned as in Pallas."""
    return cls(logical, slot * logical.nbytes, swizzled)


def extra_wavefronts(addr, nbytes: int) -> int:
  """Extra SMEM wavefronts (0 = conflict-free) of the four warps' loads of `nbytes` each at the
  byte addresses addr [128]: 16-byte loads go in 4 phases of 8 lanes, 8-byte in 2 of 16, smaller
  in 1 (32 banks of 4 bytes)."""
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


class NumpyOps:
  """The ops interface on numpy; a kernel's subclass adds `decode` and `out_factor`."""

  def __init__(self):
    self.tid = np.arange(128, dtype=np.uint32)
    self.mask = np.ones(128, bool)

  def load(self, buf: SmemImage, offset, n: int, swizzled: bool):
    offset = np.asarray(offset, np.int64)
    if swizzled:
      offset = swizzle(offset, buf.line0)
    assert np.all(offset % (4 * n) == 0), "misaligned vector load"
    raw = buf.bytes[offset[:, None] + np.arange(4 * n)]
    return list(np.ascontiguousarray(raw).view(np.uint32).T)

  def load_u8(self, buf: SmemImage, offset):
    return buf.bytes[np.asarray(offset, np.int64)].astype(np.uint32)

  def min(self, a, b):
    return np.minimum(a, np.uint32(b))

  def prmt(self, a, b, sel):
    return prmt_np(a, b, sel)

  def release(self):
    pass

  def barrier(self):
    pass

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
        lo, hi = unpack_bf16x2(reg[sel])
        A[gg + dr, 2 * qq + dk] = lo
        A[gg + dr, 2 * qq + dk + 1] = hi
      for reg, dk in zip(b, (0, 8), strict=True):
        lo, hi = unpack_bf16x2(reg[sel])
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

  def fadd(self, a, b):
    return (np.asarray(a, np.float32) + b).astype(np.float32)

  def fmul(self, a, b):
    return (np.asarray(a, np.float32) * b).astype(np.float32)

  def store_if_below(self, o_ref, col, row, val, m):
    ok = (col < m) & self.mask
    o_ref[col[ok], row[ok]] = val[ok]


# ------------------------------------------------------------------------------------------------
# MLIR emitter.


def mlir():
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith, llvm, memref, scf, vector

  return ir, arith, llvm, memref, scf, vector, mgpu_utils


class I32:
  """An i32 MLIR value with Python operators, so the address formulas above emit arith ops."""

  def __init__(self, v):
    self.v = v

  @staticmethod
  def raw(o):
    """The MLIR value of an I32, or an i32 constant for a Python int."""
    ir, arith = mlir()[:2]
    if isinstance(o, I32):
      return o.v
    i32 = ir.IntegerType.get_signless(32)
    return arith.constant(i32, ir.IntegerAttr.get(i32, int(o)))

  def _bin(self, op, o, swap=False):
    a, b = self.raw(self), self.raw(o)
    return I32(op(b, a) if swap else op(a, b))

  def __add__(self, o):
    return self._bin(mlir()[1].addi, o)

  def __radd__(self, o):
    return self._bin(mlir()[1].addi, o, swap=True)

  def __mul__(self, o):
    return self._bin(mlir()[1].muli, o)

  def __rmul__(self, o):
    return self._bin(mlir()[1].muli, o, swap=True)

  def __and__(self, o):
    return self._bin(mlir()[1].andi, o)

  def __or__(self, o):
    return self._bin(mlir()[1].ori, o)

  def __xor__(self, o):
    return self._bin(mlir()[1].xori, o)

  def __lshift__(self, o):
    return self._bin(mlir()[1].shli, o)

  def __rshift__(self, o):
    return self._bin(mlir()[1].shrui, o)


class MlirOps:
  """The ops interface as MLIR inside `inline_mgpu`; a kernel's subclass adds `decode` and
  `out_factor`."""

  def __init__(self):
    ir, *_, mgpu_utils = mlir()
    self.i32 = ir.IntegerType.get_signless(32)
    self.f32 = ir.F32Type.get()
    self.tid = I32(mgpu_utils.thread_idx())

  def smem(self, ref, slot_bytes: int):
    """(base pointer, base line % 8). Pallas aligns SMEM allocations to 1024 bytes, so the line
    is a constant 0 when slots are 1024-byte multiples; x slots of odd M read it off the address."""
    ir, arith, llvm, *_, mgpu_utils = mlir()
    ptr = mgpu_utils.memref_ptr(ref)
    if slot_bytes % 1024 == 0:
      return ptr, 0
    addr = arith.trunci(self.i32, llvm.ptrtoint(ir.IntegerType.get_signless(64), ptr))
    return ptr, (I32(addr) >> 7) & 7

  def _ptr(self, buf, offset, swizzled):
    ir, *_, mgpu_utils = mlir()
    ptr, line0 = buf
    if swizzled:
      offset = swizzle(offset, line0)
    return mgpu_utils.getelementptr(ptr, [offset.v], ir.IntegerType.get_signless(8))

  def load(self, buf, offset, n: int, swizzled: bool):
    ir, _, llvm, *_, vector, _ = mlir()
    p = self._ptr(buf, offset, swizzled)
    vec = llvm.load(ir.VectorType.get((n,), self.i32), p, alignment=4 * n)
    return [
      vector.extract(vec, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([i]))
      for i in range(n)
    ]

  def load_u8(self, buf, offset):
    ir, arith, llvm, *_ = mlir()
    byte = llvm.load(ir.IntegerType.get_signless(8), self._ptr(buf, offset, False), alignment=1)
    return I32(arith.extui(self.i32, byte))

  def min(self, a, b):
    return I32(mlir()[1].minui(a.v, I32.raw(b)))

  def prmt(self, a, b, sel):
    mgpu_utils = mlir()[-1]
    return mgpu_utils.inline_ptx(f"prmt.b32 $0, $1, $2, {sel:#x};", a, b, result_types=self.i32)

  def release(self):
    mlir()[-1].warpgroup_barrier()

  def barrier(self):
    mlir()[-1].warpgroup_barrier()

  def mma(self, a, b, c):
    return list(mlir()[-1].inline_ptx(MMA_PTX, *a, *b, *c, result_types=[self.f32] * 4))

  def index(self, v):
    ir, arith, *_ = mlir()
    return arith.index_cast(ir.IndexType.get(), I32.raw(v))

  def red_store(self, red, warp, row, col, val):
    mlir()[3].store(val, red, [self.index(warp), self.index(row), self.index(col)])

  def red_load(self, red, warp, row, col):
    return mlir()[3].load(red, [self.index(warp), self.index(row), self.index(col)])

  @contextlib.contextmanager
  def only_warp(self, w: int):
    ir, arith, _, _, scf, *_ = mlir()
    warp = lanes(self.tid)[0]
    if_op = scf.IfOp(arith.cmpi(arith.CmpIPredicate.eq, warp.v, I32.raw(w)))
    with ir.InsertionPoint(if_op.then_block):
      yield
      scf.yield_([])

  def fadd(self, a, b):
    return mlir()[1].addf(a, b)

  def fmul(self, a, b):
    return mlir()[1].mulf(a, b)

  def store_if_below(self, o_ref, col, row, val, m):
    ir, arith, _, memref, scf, *_ = mlir()
    elt = ir.MemRefType(o_ref.type).element_type
    if elt != self.f32:
      val = arith.truncf(elt, val)
    if_op = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ult, col.v, I32.raw(m)))
    with ir.InsertionPoint(if_op.then_block):
      memref.store(val, o_ref, [self.index(col), self.index(row)])
      scf.yield_([])


def acc_unpack(fa, nb: int, nt: int):
  """The carried accumulator is a [64 nb, 8 nt] WGMMA-layout array only as a register container:
  register (b, j, i) holds this warp's partial C fragment (rows g + 8 i of block b, tokens j)."""
  ir, *_, vector, _ = mlir()
  regs = fa.registers.reshape(nb, nt, 2)

  def el(v, e):
    return vector.extract(v, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([e]))

  return {
    (b, j): [el(regs[b, j, 0], 0), el(regs[b, j, 0], 1), el(regs[b, j, 1], 0), el(regs[b, j, 1], 1)]
    for b in range(nb)
    for j in range(nt)
  }


def acc_pack(acc, like, nb: int, nt: int):
  import jax.experimental.mosaic.gpu as mgpu

  ir, *_, vector, _ = mlir()
  v2 = ir.VectorType.get((2,), ir.F32Type.get())
  regs = np.empty((nb, nt, 2), dtype=object)
  for (b, j), c in acc.items():
    regs[b, j, 0] = vector.from_elements(v2, c[0:2])
    regs[b, j, 1] = vector.from_elements(v2, c[2:4])
  return mgpu.FragmentedArray(
    _registers=regs.reshape(like.registers.shape), _layout=like.layout, _is_signed=None
  )


# ------------------------------------------------------------------------------------------------
# The launch.


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
      # SMEM is only read by threads and written by TMA; a kernel's step syncs the warpgroup
      # itself once its reads of a slot are done, before the pipeline refills that slot.
      unsafe_no_auto_barriers=True,
    ),
  )
