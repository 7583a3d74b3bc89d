"""Attention of a few new queries over the KV cache (decode and verify) for Hopper: Mosaic GPU.

o[b, t, n] = softmax_s(q[b, t, n] . k[b, s, n // G] / sqrt(H) over s <= positions[b, t]) . v[...]
for q [B, T, N, H] and a static cache k, v [B, S, K, H] (specdec.ops.attention.attend's
contract), with T x G <= 128 query rows per kv head. Why a kernel: XLA runs this as ~7 launches
(q.K GEMM, mask select, softmax max and sum, convert, p.V GEMM, transpose) per layer.

Structure (flash-decoding). The T x G queries that share kv head h are one block of R = 64 (or 128)
rows, r = t G + g (q is rearranged and zero-padded by XLA, a fusion with the RoPE that makes it).
The cache slots are split into `splits` ranges of whole `block_s` blocks; one CTA (one warpgroup)
per (kv head, range, batch row) streams its K and V blocks through a TMA pipeline and keeps the
online-softmax state in registers: scores = Q K^T by wgmma (f32), masked to slots in [its range
start, positions[b, t]], scaled by log2(e) / sqrt(H), exp2 against the running row max, and P V by
wgmma with P in bf16 from registers. It writes unnormalized rows o [TG, H] (f32) and the row max m
and sum l; `combine` (one XLA fusion) weighs the ranges by exp2(m - max m) and normalizes. Ranges
that do not divide the blocks pull the last one back to end at S, its overlap masked.

Draft trees (specdec.ops.attention.TreeMask: node j's K/V at slot root + j; a query sees the
slots < root and the nodes it marks): the kernel runs as is with every row's limit at root - 1, and
the n-slot node window is one more range in jnp (`tree_partials`: the kernel's scale and bf16 P,
the tree's mask) that `combine` merges. A prefix with no slot (root 0) keeps m = MASKED, weight 0.

FP8 caches (E4M3 codes, read as code x k_scale / v_scale) stream as codes, half the bytes; each
block is widened in SMEM (E4M3 -> f16 -> bf16, exact) before the two wgmma, k_scale joins the
score scale and v_scale the combine, so no widened copy of the cache is written. head_dim 256 with
128 query rows exceeds SMEM (`code_smem_bytes`). Exactness: a row depends on its own query, its
position, the cache and the split plan, not on other rows; against `attend` ~2e-3 relative.
Testing without a GPU: the lowering for cuda, the plan, and `combine` over `reference_partials`
(the kernel's ranges and masks in jnp) against `attend`. Figures: docs/benchmarks.md.
"""

import dataclasses
import functools
import math
import statistics

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp

from kernels_pallas.bench_util import call_times_us
from kernels_pallas.h200 import NUM_SMS, SMEM_BYTES

ROW_TILE = 64  # wgmma M
LOG2E = math.log2(math.e)
MASKED = -1e30  # finite: a range with no visible slot gets weight exp2(MASKED - max) = 0, no NaN
TARGET_CTAS = 2 * NUM_SMS  # two per SM
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
FP8 = jnp.dtype(jnp.float8_e4m3fn)  # the KV cache's 8-bit dtype (specdec.models.transformer)


@dataclasses.dataclass(frozen=True)
class TuningConfig:
  block_s: int = 64  # cache slots per pipeline step
  splits: int = 1  # slot ranges per (kv head, batch row), one CTA each
  stages: int = 2  # TMA pipeline depth

  def check(self, slots: int, head_dim: int) -> None:
    if self.block_s % 64 or slots % self.block_s:
      raise ValueError(f"block_s={self.block_s} must be a multiple of 64 dividing S={slots}")
    if not 1 <= self.splits <= slots // self.block_s:
      raise ValueError(
        f"splits={self.splits} must be in [1, S / block_s = {slots // self.block_s}]"
      )
    if head_dim % 64 or head_dim > 256:
      raise ValueError(f"head_dim={head_dim} must be a multiple of 64, at most 256")


@dataclasses.dataclass(frozen=True)
class Plan:
  """Where each CTA reads: range p covers blocks [p per, (p + 1) per) clipped to the cache."""

  blocks: int  # S / block_s
  per: int  # blocks per range
  splits: int  # ranges that hold at least one block

  @staticmethod
  def of(slots: int, config: TuningConfig) -> "Plan":
    blocks = slots // config.block_s
    per = -(-blocks // config.splits)
    return Plan(blocks, per, -(-blocks // per))

  def first_block(self, p):
    """First block a CTA loads: the last range is pulled back so that `per` blocks exist."""
    return jnp.minimum(p * self.per, self.blocks - self.per)


def default_config(batch: int, kv_heads: int, slots: int, rows: int) -> TuningConfig:
  """64-slot blocks; as many ranges as keep the grid within one wave of two CTAs per SM (a partial
  second wave measured slower), but at least two blocks per range (one-block CTAs are all latency)
  and no more than S / (8 T G) ranges, above which the f32 partials cost more than the parallelism
  buys. H200 sweep: docs/benchmarks.md."""
  want = max(1, TARGET_CTAS // (batch * kv_heads))
  return TuningConfig(block_s=64, splits=max(1, min(want, slots // 128, slots // (8 * rows))))


def query_rows(q_BTNH: jax.Array, kv_heads: int) -> tuple[jax.Array, int]:
  """q [B, T, N, H] -> [B, K, R, H] with row r = t G + g, zero rows up to R (a multiple of 64)."""
  B, T, N, H = q_BTNH.shape
  G = N // kv_heads
  tg = T * G
  rows = ROW_TILE * -(-tg // ROW_TILE)
  q_BKRH = q_BTNH.reshape(B, T, kv_heads, G, H).transpose(0, 2, 1, 3, 4).reshape(B, kv_heads, tg, H)
  return jnp.pad(q_BKRH, ((0, 0), (0, 0), (0, rows - tg), (0, 0))), tg


def row_queries(T: int, groups: int, rows: int) -> jax.Array:
  """The query t of each row r = t G + g [R]; padding rows repeat the last query."""
  return jnp.minimum(jnp.arange(rows) // groups, T - 1)


def row_limits(positions_BT: jax.Array, groups: int, rows: int) -> jax.Array:
  """The last visible slot of each query row [B, R]."""
  return positions_BT[:, row_queries(positions_BT.shape[1], groups, rows)].astype(jnp.int32)


def _smem_transforms(dtype, head_dim: int):
  """TMA tiling + swizzle of a [rows, head_dim] tile: 128-byte rows for 16-bit data, and for
  8-bit codes rows of min(head_dim, 128) bytes."""
  if jnp.dtype(dtype).itemsize == 2:
    return (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
  width = min(head_dim, 128)
  return (plgpu.TilingTransform((8, width)), plgpu.SwizzleTransform(width))


def _kernel_partials(
  q_BKRH, k_BSKH, v_BSKH, limit_BR, tg: int, config: TuningConfig, score_scale_R=None
):
  """The kernel's partials. FP8 caches (`score_scale_R` given: k_scale x H^-1/2 x log2 e per
  row, f32) stream as codes, half the bytes; each block is widened to q's dtype in SMEM (E4M3 ->
  f16 -> bf16, exact) before the two wgmma, and the scale multiplies the f32 scores; v_scale is
  `combine`'s."""
  B, K, R, H = q_BKRH.shape
  S = k_BSKH.shape[1]
  plan = Plan.of(S, config)
  bs = config.block_s
  codes = score_scale_R is not None
  scale = H**-0.5 * LOG2E
  mma_smem = _smem_transforms(q_BKRH.dtype, H)
  wgmma_rows = plgpu.Layout.WGMMA.reduce(1)

  def kernel(q_ref, k_ref, v_ref, lim_ref, *refs):
    if codes:
      sc_ref, o_ref, m_ref, l_ref, q_smem, lim_smem, bar, sc_smem, k_wide, v_wide = refs
    else:
      o_ref, m_ref, l_ref, q_smem, lim_smem, bar = refs
    h, p, b = (jax.lax.axis_index(n) for n in ("h", "p", "b"))
    first = plan.first_block(p)
    lo = p * plan.per * bs  # slots below belong to the previous range
    # Q and the row limits load beside the pipeline's first K/V blocks; step 0 waits for them.
    plgpu.copy_gmem_to_smem(q_ref.at[b, h], q_smem, bar)
    plgpu.copy_gmem_to_smem(lim_ref.at[b], lim_smem, bar)
    if codes:
      plgpu.copy_gmem_to_smem(sc_ref, sc_smem, bar)

    def body(idx, k_smem, v_smem, carry):
      acc_RH, m_R, l_R = carry
      pl.when(idx[0] == 0)(lambda: plgpu.barrier_wait(bar))
      hi_R = plgpu.load(lim_smem, layout=wgmma_rows)
      if codes:
        # No E4M3 -> bf16 conversion on sm_90: through f16, exact both ways (<= 4 significant bits).
        for src, dst in ((k_smem, k_wide), (v_smem, v_wide)):
          dst[...] = src[...].astype(jnp.float16).astype(dst.dtype)
        plgpu.commit_smem()  # fence to the async proxy + warpgroup barrier before wgmma reads
        k_smem, v_smem = k_wide, v_wide

      def scores(acc_ref):
        plgpu.wgmma(acc_ref, q_smem, k_smem.transpose((1, 0)))
        return acc_ref[...]

      s_RS = pl.run_scoped(scores, plgpu.ACC((R, bs), jnp.float32))
      slot_RS = plgpu.broadcasted_iota(jnp.int32, (R, bs), 1, layout=plgpu.Layout.WGMMA)
      slot_RS = slot_RS + (first + idx[0]) * bs
      visible = (slot_RS >= lo) & (slot_RS <= jax.lax.broadcast_in_dim(hi_R, (R, bs), [0]))
      if codes:
        s_RS = s_RS * jax.lax.broadcast_in_dim(plgpu.load(sc_smem, layout=wgmma_rows), (R, bs), [0])
      else:
        s_RS = s_RS * scale
      s_RS = jnp.where(visible, s_RS, MASKED)
      m_new = jnp.maximum(m_R, s_RS.max(axis=1))
      alpha_R = jnp.exp2(m_R - m_new)
      p_RS = jnp.exp2(s_RS - jax.lax.broadcast_in_dim(m_new, (R, bs), [0]))
      l_R = l_R * alpha_R + p_RS.sum(axis=1)
      acc_RH = acc_RH * jax.lax.broadcast_in_dim(alpha_R, (R, H), [0])

      def values(acc_ref):
        plgpu.wgmma(acc_ref, p_RS.astype(v_smem.dtype), v_smem)

      return pl.run_state(values)(plgpu.ACC.init(acc_RH)), m_new, l_R

    spec = plgpu.BlockSpec(
      (bs, H), lambda i: (first + i, 0), transforms=_smem_transforms(k_BSKH.dtype, H)
    )
    acc_RH, m_R, l_R = plgpu.emit_pipeline(
      body,
      grid=(plan.per,),
      in_specs=[spec, spec],
      max_concurrent_steps=min(config.stages, plan.per),
      init_carry=(
        plgpu.layout_cast(jnp.zeros((R, H), jnp.float32), plgpu.Layout.WGMMA),
        plgpu.layout_cast(jnp.full((R,), MASKED, jnp.float32), wgmma_rows),
        plgpu.layout_cast(jnp.zeros((R,), jnp.float32), wgmma_rows),
      ),
    )(k_ref.at[b, :, h], v_ref.at[b, :, h])

    def store(o_smem, ml_smem):
      o_smem[...] = acc_RH
      ml_smem[0] = m_R
      ml_smem[1] = l_R
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_smem.at[pl.ds(0, tg)], o_ref.at[b, h, p])
      plgpu.copy_smem_to_gmem(ml_smem.at[0], m_ref.at[b, h, p])
      plgpu.copy_smem_to_gmem(ml_smem.at[1], l_ref.at[b, h, p])
      plgpu.wait_smem_to_gmem(0)

    # The pipeline's buffers are free here: the output staging reuses their SMEM.
    pl.run_scoped(store, plgpu.SMEM((R, H), jnp.float32), plgpu.SMEM((2, R), jnp.float32))

  P = plan.splits
  return plgpu.kernel(
    kernel,
    out_type=(
      jax.ShapeDtypeStruct((B, K, P, tg, H), jnp.float32),
      jax.ShapeDtypeStruct((B, K, P, R), jnp.float32),
      jax.ShapeDtypeStruct((B, K, P, R), jnp.float32),
    ),
    grid=(K, P, B),
    grid_names=("h", "p", "b"),
    scratch_types=(
      plgpu.SMEM((R, H), q_BKRH.dtype, transforms=mma_smem),
      plgpu.SMEM((R,), jnp.int32),
      plgpu.Barrier(num_arrivals=3 if codes else 2),
      *(
        (plgpu.SMEM((R,), jnp.float32),)
        + (plgpu.SMEM((bs, H), q_BKRH.dtype, transforms=mma_smem),) * 2
        if codes
        else ()
      ),
    ),
  )(q_BKRH, k_BSKH, v_BSKH, limit_BR, *(() if score_scale_R is None else (score_scale_R,)))


def _masked_partials(q_BKRH, k_BPSKH, v_BPSKH, visible_BPRS, scale):
  """The online-softmax state of the slots each range p gathers, as the kernel keeps it: scores
  times `scale` (to the exp2 scale; a float or [R, 1]) where visible, else MASKED, their row max
  m, exp2 sum l and unnormalized o [B, K, P, R, H] with P in q's dtype. FP8 codes widen exactly."""
  k_BPSKH, v_BPSKH = (c.astype(q_BKRH.dtype) for c in (k_BPSKH, v_BPSKH))
  s_BKPRS = (
    jnp.einsum("BKRH,BPSKH->BKPRS", q_BKRH, k_BPSKH, preferred_element_type=jnp.float32) * scale
  )
  s_BKPRS = jnp.where(visible_BPRS[:, None], s_BKPRS, MASKED)
  m_BKPR = s_BKPRS.max(-1)
  p_BKPRS = jnp.exp2(s_BKPRS - m_BKPR[..., None])
  l_BKPR = p_BKPRS.sum(-1)
  o_BKPRH = jnp.einsum(
    "BKPRS,BPSKH->BKPRH", p_BKPRS.astype(v_BPSKH.dtype), v_BPSKH, preferred_element_type=jnp.float32
  )
  return o_BKPRH, m_BKPR, l_BKPR


def reference_partials(
  q_BKRH, k_BSKH, v_BSKH, limit_BR, tg: int, config: TuningConfig, score_scale_R=None
):
  """What the kernel writes, in jnp: per range p the unnormalized o [B, K, P, TG, H], and the row
  max m and sum l [B, K, P, R] on the exp2 scale, with the kernel's masks and bf16 P."""
  H = q_BKRH.shape[3]
  scale = H**-0.5 * LOG2E if score_scale_R is None else score_scale_R[:, None]
  plan = Plan.of(k_BSKH.shape[1], config)
  bs = config.block_s
  p_P = jnp.arange(plan.splits)
  first_P = plan.first_block(p_P)
  slot_PS = (first_P[:, None] + jnp.arange(plan.per)[None, :]) * bs
  slot_PS = (slot_PS[:, :, None] + jnp.arange(bs)).reshape(plan.splits, plan.per * bs)
  lo_P = p_P * plan.per * bs
  visible_BPRS = (slot_PS[None, :, None, :] >= lo_P[None, :, None, None]) & (
    slot_PS[None, :, None, :] <= limit_BR[:, None, :, None]
  )
  o_BKPRH, m_BKPR, l_BKPR = _masked_partials(
    q_BKRH, k_BSKH[:, slot_PS], v_BSKH[:, slot_PS], visible_BPRS, scale
  )
  return o_BKPRH[:, :, :, :tg], m_BKPR, l_BKPR


def tree_partials(q_BKRH, k_BSKH, v_BSKH, tree, tg: int, score_scale_R):
  """A tree's node window as one more range, in jnp: node j's K/V at slot root_B + j (n slots
  gathered per row), each row seeing the nodes `tree.sees_Tn` marks for its query. The kernel's
  exp2 scale (`score_scale_R` [R], f32) and bf16 P, so `combine` merges it with its ranges."""
  B, _, R, _ = q_BKRH.shape
  T, n = tree.sees_Tn.shape
  slot_Bn = tree.root_B[:, None] + jnp.arange(n)
  b_B1 = jnp.arange(B)[:, None]
  sees_Rn = jnp.asarray(tree.sees_Tn)[row_queries(T, tg // T, R)]
  o_BKPRH, m_BKPR, l_BKPR = _masked_partials(
    q_BKRH,
    k_BSKH[b_B1, slot_Bn][:, None],
    v_BSKH[b_B1, slot_Bn][:, None],
    jnp.broadcast_to(sees_Rn, (B, 1, R, n)),
    score_scale_R[:, None],
  )
  return o_BKPRH[:, :, :, :tg], m_BKPR, l_BKPR


def combine(o_BKPTH, m_BKPR, l_BKPR, T: int, dtype, v_scale=1.0) -> jax.Array:
  """Weighs each range by exp2(m - max m), normalizes (times an FP8 cache's v_scale), and puts
  rows back as [B, T, N, H]."""
  B, K, _, tg, H = o_BKPTH.shape
  m_BKPT, l_BKPT = m_BKPR[..., :tg], l_BKPR[..., :tg]
  w_BKPT = jnp.exp2(m_BKPT - m_BKPT.max(axis=2, keepdims=True))
  o_BKTH = (o_BKPTH * w_BKPT[..., None]).sum(2) / (l_BKPT * w_BKPT).sum(2)[..., None] * v_scale
  G = tg // T
  return (
    o_BKTH.reshape(B, K, T, G, H).transpose(0, 2, 1, 3, 4).reshape(B, T, K * G, H).astype(dtype)
  )


def supported(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array) -> bool:
  """A GPU, a 16-bit q with caches of its dtype or FP8 (E4M3) codes, head_dim a multiple of 64
  up to 256, S a multiple of 64, and at most 128 query rows (T x G) per kv head."""
  if jax.default_backend() != "gpu" or q_BTNH.ndim != 4 or k_BSKH.shape != v_BSKH.shape:
    return False
  cache = {k_BSKH.dtype, v_BSKH.dtype}
  if q_BTNH.dtype not in DTYPES or cache not in ({q_BTNH.dtype}, {FP8}):
    return False
  B, T, N, H = q_BTNH.shape
  K = k_BSKH.shape[2]
  tg = T * (N // K)
  fits = cache == {q_BTNH.dtype} or code_smem_bytes(tg, H, TuningConfig()) <= SMEM_BYTES
  return H % 64 == 0 and H <= 256 and k_BSKH.shape[1] % 64 == 0 and tg <= 2 * ROW_TILE and fits


def code_smem_bytes(tg: int, head_dim: int, config: TuningConfig) -> int:
  """SMEM of the FP8-cache kernel: Q, the two widened blocks, and the larger of the code
  pipeline and the f32 output staging that reuses it (16-bit caches always fit)."""
  rows = ROW_TILE * -(-tg // ROW_TILE)
  pipeline = 2 * config.stages * config.block_s * head_dim
  staging = 4 * rows * head_dim + 8 * rows
  return 2 * rows * head_dim + 2 * 2 * config.block_s * head_dim + max(pipeline, staging)


@functools.partial(jax.jit, static_argnames=("config", "partials"))
def decode_attention(
  q_BTNH,
  k_BSKH,
  v_BSKH,
  positions_BT,
  k_scale=1.0,
  v_scale=1.0,
  *,
  tree=None,
  config: TuningConfig | None = None,
  partials=None,
):
  """attend(q, k, v, positions, tree=tree) through the kernel (or `partials`, e.g.
  `reference_partials`). FP8 caches hold codes: attention reads code x k_scale / v_scale
  (specdec.models.transformer's `from_cache`), without widening the cache first; other caches
  ignore the scales. A tree (specdec.ops.attention.TreeMask: root_B, sees_Tn; positions unused)
  leaves the kernel the committed slots < root_B, and `tree_partials` adds its node window."""
  B, T, N, H = q_BTNH.shape
  K = k_BSKH.shape[2]
  q_BKRH, tg = query_rows(q_BTNH, K)
  R = q_BKRH.shape[2]
  config = config or default_config(B, K, k_BSKH.shape[1], tg)
  config.check(k_BSKH.shape[1], H)
  if tree is not None:
    positions_BT = jnp.broadcast_to(tree.root_B[:, None] - 1, (B, T))
  limit_BR = row_limits(positions_BT, N // K, R)
  codes = k_BSKH.dtype == FP8
  scale_R = jnp.full((R,), H**-0.5 * LOG2E, jnp.float32) * (k_scale if codes else 1.0)
  extra = (scale_R,) if codes else ()
  o, m, l = (partials or _kernel_partials)(q_BKRH, k_BSKH, v_BSKH, limit_BR, tg, config, *extra)
  if tree is not None:
    window = tree_partials(q_BKRH, k_BSKH, v_BSKH, tree, tg, scale_R)
    o, m, l = (jnp.concatenate(x, axis=2) for x in zip((o, m, l), window, strict=True))
  return combine(o, m, l, T, q_BTNH.dtype, v_scale if codes else 1.0)


# ------------------------------------------------------------------------------------------------
# Benchmark: `python -m experiments.bench_kernel --kernel=attention` on the GPU.


def _chain(op):
  """One call per layer's cache, so K/V stream from HBM rather than the 50 MB L2."""
  return jax.jit(lambda q, ks, vs, pos: [op(q, k, v, pos) for k, v in zip(ks, vs, strict=True)])


def bench_case(attend_xla, B, S, T, K, G, H, configs, layers: int, iterations: int) -> None:
  """Prints CUPTI kernel time per layer-call (XLA's fusions around the kernel included) of the
  kernel at each config and of `attend_xla` (XLA's attention, the baseline: the caller's, so this
  file needs no specdec.ops), and the kernel's error against f32 `attend_xla`."""
  keys = jax.random.split(jax.random.key(B * S + T), 3)
  q = jax.random.normal(keys[0], (B, T, K * G, H), jnp.bfloat16)
  ks, vs = (
    [
      jax.random.normal(jax.random.fold_in(key, i), (B, S, K, H), jnp.bfloat16)
      for i in range(layers)
    ]
    for key in keys[1:]
  )
  pos = jnp.broadcast_to(S - T + jnp.arange(T, dtype=jnp.int32), (B, T))
  args = (q, ks, vs, pos)
  ref = attend_xla(*(a.astype(jnp.float32) for a in (q, ks[0], vs[0])), pos)
  kv_mb = 2 * B * S * K * H * 2 / 1e6
  t_xla = statistics.median(call_times_us(_chain(attend_xla), args, layers, iterations))
  for config in configs:
    c = config or default_config(B, K, S, T * G)
    head = f"B={B} S={S} T={T} K,G,H={K},{G},{H} cfg={c.block_s}/{c.splits}/{c.stages}"
    try:
      c.check(S, H)
    except ValueError as e:
      print(f"{head}: skipped ({e})")
      continue
    op = functools.partial(decode_attention, config=config)
    err = float(jnp.linalg.norm(op(q, ks[0], vs[0], pos) - ref) / jnp.linalg.norm(ref))
    t = statistics.median(call_times_us(_chain(op), args, layers, iterations))
    print(
      f"{head} | kernel {t:6.1f} us ({kv_mb / t:.2f} TB/s) | XLA {t_xla:6.1f} us | "
      f"x{t_xla / t:.2f} | rel_err {err:.1e}",
      flush=True,
    )


def main(
  attend_xla,
  *,
  shape=(8, 4, 128),
  batches=(1, 8),
  widths=(1, 5, 16),
  slots=(1024, 8192),
  layers: int = 16,
  configs=(),
  iterations: int = 5,
) -> None:
  """The kernel against `attend_xla` for every batch x slots x width, shape = (kv heads, groups,
  head dim), the heuristic's config and each of `configs` ((block_s, splits, stages) tuples);
  `layers` caches cycled so K/V come from HBM. Run by experiments/bench_kernel.py
  --kernel=attention."""
  K, G, H = shape
  configs = [None] + [TuningConfig(*c) for c in configs]
  for b in batches:
    for s in slots:
      for t in widths:
        bench_case(attend_xla, b, s, t, K, G, H, configs, layers, iterations)
