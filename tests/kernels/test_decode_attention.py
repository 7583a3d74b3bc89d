"""Decode attention kernel (kernels_pallas/decode_attention.py): plan, combine, lowering, GPU runs.

The Pallas GPU interpreter has no wgmma, so on a CPU: (1) the split plan covers every slot once,
(2) `combine` over `reference_partials` (the kernel's ranges, masks and bf16 P in jnp) equals
`attend_xla` within bf16 rounding, including ranges that see no slot at all, (3) the kernel lowers
to a Mosaic GPU custom call for cuda (the Mosaic GPU dialect lowering runs on a CPU), and (4) the
model's `attend` keeps XLA off a GPU. `-m gpu` runs the kernel itself (JAX_PLATFORMS=cuda). Draft
trees (a `TreeMask`) go through the same checks: the kernel's prefix ranges and the jnp node window.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas import decode_attention as da
from specdec.decoding.tree import tree
from specdec.ops import attention as attention_ops
from specdec.ops.attention import TreeMask, attend, attend_xla

# Both paths round P (or its normalized form) to bf16 before P V; against an f32 reference each
# lands near 2e-3 relative error (docs/benchmarks.md), so 1e-2 separates rounding from a bug.
TOL = 1e-2

CASES = [
  # B, T, N, K, H, S, config (None: default_config)
  (1, 1, 32, 8, 128, 1216, None),  # 19 blocks: uneven ranges, the last one pulled back
  (2, 5, 32, 8, 128, 256, da.TuningConfig(64, 3, 2)),
  (1, 16, 24, 4, 256, 512, None),  # T G = 96 rows: two row tiles
  (3, 3, 4, 2, 64, 192, da.TuningConfig(64, 2, 2)),
  (2, 2, 8, 2, 128, 512, da.TuningConfig(128, 4, 3)),
]


def inputs(B, T, N, K, H, S, seed=0):
  ks = jax.random.split(jax.random.key(seed + S + T), 3)
  q = jax.random.normal(ks[0], (B, T, N, H), jnp.bfloat16)
  k = jax.random.normal(ks[1], (B, S, K, H), jnp.bfloat16)
  v = jax.random.normal(ks[2], (B, S, K, H), jnp.bfloat16)
  start = np.random.default_rng(S + B).integers(0, S - T, (B, 1))
  return q, k, v, jnp.asarray(start + np.arange(T), jnp.int32)


def rel_err(y, ref):
  return float(jnp.linalg.norm(y.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))


def f32_reference(q, k, v, pos, tree=None):
  return attend_xla(*(a.astype(jnp.float32) for a in (q, k, v)), pos, tree)


@pytest.mark.parametrize("slots,block_s,splits", [(1216, 64, 19), (1216, 64, 8), (512, 128, 3)])
def test_plan_covers_every_slot_once(slots, block_s, splits):
  plan = da.Plan.of(slots, da.TuningConfig(block_s, splits))
  seen = np.zeros(slots, int)
  for p in range(plan.splits):
    first = int(plan.first_block(p))
    loaded = np.arange(first * block_s, (first + plan.per) * block_s)
    assert loaded.max() < slots  # the last range is pulled back inside the cache
    seen[loaded[loaded >= p * plan.per * block_s]] += 1  # the kernel's lower mask
  np.testing.assert_array_equal(seen, 1)


@pytest.mark.parametrize("B,T,N,K,H,S,config", CASES)
def test_reference_partials_combine_to_attention(B, T, N, K, H, S, config):
  q, k, v, pos = inputs(B, T, N, K, H, S)
  y = da.decode_attention(q, k, v, pos, config=config, partials=da.reference_partials)
  ref = f32_reference(q, k, v, pos)
  assert rel_err(y, ref) < TOL
  assert rel_err(y, ref) < 1.5 * rel_err(attend_xla(q, k, v, pos), ref)  # no worse than XLA's


def test_ranges_with_no_visible_slot_get_no_weight():
  # Positions near the start: most ranges see nothing, and must not turn the sum into NaN.
  q, k, v, _ = inputs(2, 2, 8, 2, 128, 1024)
  pos = jnp.asarray([[0, 1], [3, 4]], jnp.int32)
  y = da.decode_attention(
    q, k, v, pos, config=da.TuningConfig(64, 16), partials=da.reference_partials
  )
  assert np.isfinite(np.asarray(y, np.float32)).all()
  assert rel_err(y, f32_reference(q, k, v, pos)) < TOL


def test_default_config_follows_the_measured_sweep():
  # H200, 2026-11-30 (docs/benchmarks.md): the best of the configs measured per case.
  assert da.default_config(1, 8, 1024, 4) == da.TuningConfig(64, 8)
  assert da.default_config(1, 8, 8192, 4) == da.TuningConfig(64, 33)  # 32 ranges of 4 blocks
  assert da.default_config(8, 8, 8192, 4) == da.TuningConfig(64, 4)  # 256 CTAs: one wave
  assert da.default_config(1, 8, 8192, 64) == da.TuningConfig(64, 16)  # 16-token verify
  assert da.default_config(1, 8, 128, 4) == da.TuningConfig(64, 1)


@pytest.mark.parametrize("B,T,N,K,H,S,config", CASES[:3])
def test_kernel_lowers_for_cuda_on_cpu(B, T, N, K, H, S, config):
  q, k, v, pos = inputs(B, T, N, K, H, S)
  fn = jax.jit(lambda *a: da.decode_attention(*a, config=config))
  assert "mosaic_gpu" in jax.export.export(fn, platforms=["cuda"])(q, k, v, pos).mlir_module()


def test_supported_shapes():
  q, k, v, _ = inputs(1, 1, 32, 8, 128, 256)
  assert not da.supported(q, k, v)  # a CPU
  with pytest.raises(ValueError, match="block_s=64 must be a multiple of 64 dividing S=100"):
    da.TuningConfig().check(100, 128)
  with pytest.raises(ValueError, match="head_dim=96"):
    da.TuningConfig().check(256, 96)


def test_model_attention_is_xla_off_gpu():
  q, k, v, pos = inputs(1, 2, 8, 2, 64, 128)
  np.testing.assert_array_equal(attend(q, k, v, pos), attend_xla(q, k, v, pos))


@pytest.mark.gpu
@pytest.mark.parametrize("B,T,N,K,H,S,config", CASES)
def test_kernel_matches_reference_on_gpu(B, T, N, K, H, S, config):
  q, k, v, pos = inputs(B, T, N, K, H, S)
  y = da.decode_attention(q, k, v, pos, config=config)
  y_ref = da.decode_attention(q, k, v, pos, config=config, partials=da.reference_partials)
  assert rel_err(y, y_ref.astype(jnp.float32)) < TOL
  assert rel_err(y, f32_reference(q, k, v, pos)) < TOL


@pytest.mark.gpu
def test_model_attention_uses_the_kernel_on_gpu():
  q, k, v, pos = inputs(1, 1, 32, 8, 128, 256)
  assert da.supported(q, k, v)
  text = jax.jit(attend).lower(q, k, v, pos).as_text()
  assert "mosaic_gpu" in text


# --- FP8 caches: the kernel reads E4M3 codes and their scales --------------------------------

FP8_CASES = [
  # B, T, N, K, H, S, config; head_dim 64 takes 64-byte code rows
  (1, 1, 32, 8, 128, 1216, None),
  (2, 5, 8, 2, 64, 256, da.TuningConfig(64, 3, 2)),
  (1, 16, 32, 8, 128, 512, None),  # 64 rows of a 16-token verify
]
K_SCALE, V_SCALE = 0.37, 1.9


def fp8_inputs(B, T, N, K, H, S):
  q, k, v, pos = inputs(B, T, N, K, H, S, seed=2)
  codes = ((x.astype(jnp.float32) * 3).astype(jnp.float8_e4m3fn) for x in (k, v))
  return q, *codes, pos


def fp8_reference(q, k, v, pos, tree=None):
  k, v = k.astype(jnp.float32) * K_SCALE, v.astype(jnp.float32) * V_SCALE
  return attend_xla(q.astype(jnp.float32), k, v, pos, tree)


@pytest.mark.parametrize("B,T,N,K,H,S,config", FP8_CASES)
def test_fp8_reference_partials_read_codes_times_scales(B, T, N, K, H, S, config):
  q, k, v, pos = fp8_inputs(B, T, N, K, H, S)
  y = da.decode_attention(
    q, k, v, pos, K_SCALE, V_SCALE, config=config, partials=da.reference_partials
  )
  assert rel_err(y, fp8_reference(q, k, v, pos)) < TOL


@pytest.mark.parametrize("B,T,N,K,H,S,config", FP8_CASES[:2])
def test_fp8_kernel_lowers_for_cuda_on_cpu(B, T, N, K, H, S, config):
  q, k, v, pos = fp8_inputs(B, T, N, K, H, S)
  fn = jax.jit(lambda *a: da.decode_attention(*a, config=config))
  text = jax.export.export(fn, platforms=["cuda"])(q, k, v, pos, K_SCALE, V_SCALE).mlir_module()
  assert "mosaic_gpu" in text


def test_fp8_kernel_smem_bound():
  # Q, two widened blocks and the f32 staging: 128 rows of head_dim 256 need 257 KiB, too many
  # (the model then widens the cache and runs the 16-bit kernel); 64 rows of 128 need 80.5.
  assert da.code_smem_bytes(96, 256, da.TuningConfig()) > da.SMEM_BYTES
  assert da.code_smem_bytes(4, 128, da.TuningConfig()) < da.SMEM_BYTES


def test_model_attention_reads_fp8_codes_times_scales_off_gpu():
  q, k, v, pos = fp8_inputs(1, 2, 8, 2, 64, 128)
  y = attend(q, k, v, pos, K_SCALE, V_SCALE)
  assert rel_err(y, fp8_reference(q, k, v, pos)) < TOL


@pytest.mark.parametrize("takes_codes", [True, False])
def test_model_attention_dispatch_for_fp8_caches(monkeypatch, takes_codes):
  # A stand-in kernel module: with codes it gets the stored codes and the scales; where it refuses
  # them (SMEM), the caches widened by from_cache and no scales; where it refuses both, XLA runs.
  calls = []

  class Kernels:
    @staticmethod
    def supported(q, k, v):
      return takes_codes or k.dtype != da.FP8

    @staticmethod
    def decode_attention(q, k, v, pos, *scales, tree=None):
      calls.append((k.dtype, scales))
      return q

  monkeypatch.setattr(attention_ops, "_attention_kernels", lambda: Kernels)
  q, k, v, pos = fp8_inputs(1, 2, 8, 2, 64, 128)
  attend(q, k, v, pos, K_SCALE, V_SCALE)
  assert calls == ([(da.FP8, (K_SCALE, V_SCALE))] if takes_codes else [(q.dtype, ())])


@pytest.mark.gpu
@pytest.mark.parametrize("B,T,N,K,H,S,config", FP8_CASES)
def test_fp8_kernel_matches_reference_on_gpu(B, T, N, K, H, S, config):
  q, k, v, pos = fp8_inputs(B, T, N, K, H, S)
  assert da.supported(q, k, v)
  args = (q, k, v, pos, K_SCALE, V_SCALE)
  y = da.decode_attention(*args, config=config)
  y_ref = da.decode_attention(*args, config=config, partials=da.reference_partials)
  assert rel_err(y, y_ref.astype(jnp.float32)) < TOL
  assert rel_err(y, fp8_reference(q, k, v, pos)) < TOL


@pytest.mark.gpu
def test_model_attention_keeps_fp8_codes_on_gpu():
  q, k, v, pos = fp8_inputs(1, 1, 32, 8, 128, 256)
  text = jax.jit(attend).lower(q, k, v, pos, K_SCALE, V_SCALE).as_text()
  assert "mosaic_gpu" in text and "f8E4M3FN" in text
  # The codes go into the kernel as they are: no [B, S, K, H] widening ahead of it.
  assert (
    "bf16[1,256,8,128]" not in jax.jit(attend).lower(q, k, v, pos, 1.0, 1.0).compile().as_text()
  )


# --- Draft trees: the kernel reads the committed prefix, the node window is one jnp range -------

TREES = {
  "chain": [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)],
  "wide": [(r,) for r in range(8)],
  "deep": [(0,), (1,), *((0,) * d for d in range(2, 9)), (1, 0), (1, 0, 0)],
  "vllm": [(0,), (1,), (0, 0), (0, 1), (1, 0)],
}
TREE_CASES = [
  # B, N, K, H, S, config, tree. Roots 62 (the window crosses the boundary at slot 64 of 64-slot
  # ranges), 0 (no committed slot: the kernel's ranges get no weight) and S - n (the cache's end).
  *((3, 8, 2, 128, 256, da.TuningConfig(64, 4), name) for name in TREES),
  (1, 32, 8, 128, 1216, None, "vllm"),
  (1, 24, 4, 64, 192, da.TuningConfig(64, 3), "deep"),
]


def tree_inputs(B, N, K, H, S, name, seed=0):
  """q over the tree's n nodes, the caches, the RoPE positions root + depth, and the mask."""
  t = tree(TREES[name])
  q, k, v, _ = inputs(B, t.size, N, K, H, S, seed)
  root_B = jnp.asarray([62, 0, S - t.size][:B], jnp.int32)
  pos = root_B[:, None] + jnp.asarray(t.depths)[None, :]
  return q, k, v, pos, TreeMask(root_B, np.arange(t.size), t.ancestors)


@pytest.mark.parametrize("B,N,K,H,S,config,name", TREE_CASES)
def test_tree_reference_partials_combine_to_tree_attention(B, N, K, H, S, config, name):
  q, k, v, pos, mask = tree_inputs(B, N, K, H, S, name)
  y = da.decode_attention(q, k, v, pos, tree=mask, config=config, partials=da.reference_partials)
  ref = f32_reference(q, k, v, pos, mask)
  assert rel_err(y, ref) < TOL
  assert rel_err(y, ref) < 1.5 * rel_err(attend_xla(q, k, v, pos, mask), ref)  # no worse than XLA's


def test_a_tree_forward_over_some_nodes():
  # specdec.drafters.heads: queries for the nodes with children only, a window without the root.
  t = tree(TREES["vllm"])
  q, k, v, _ = inputs(2, 3, 8, 2, 64, 256)
  q_m = np.asarray([1, 2, 3])
  mask = TreeMask(jnp.asarray([5, 120], jnp.int32), q_m - 1, t.ancestors[q_m][:, 1:])
  pos = mask.root_B[:, None] + jnp.asarray(t.depths[q_m])[None, :]
  y = da.decode_attention(q, k, v, pos, tree=mask, partials=da.reference_partials)
  assert rel_err(y, f32_reference(q, k, v, pos, mask)) < TOL


def test_fp8_tree_reads_codes_times_scales():
  q, k, v, pos, mask = tree_inputs(3, 8, 2, 64, 256, "vllm", seed=2)
  k, v = ((x.astype(jnp.float32) * 3).astype(jnp.float8_e4m3fn) for x in (k, v))
  y = da.decode_attention(
    q, k, v, pos, K_SCALE, V_SCALE, tree=mask, config=da.TuningConfig(64, 4),
    partials=da.reference_partials,
  )  # fmt: skip
  assert rel_err(y, fp8_reference(q, k, v, pos, mask)) < TOL


@pytest.mark.parametrize("fp8", [False, True])
def test_tree_kernel_lowers_for_cuda_on_cpu(fp8):
  q, k, v, pos, mask = tree_inputs(3, 8, 2, 128, 256, "vllm")
  if fp8:
    k, v = (x.astype(jnp.float8_e4m3fn) for x in (k, v))
  fn = jax.jit(lambda *a, tree: da.decode_attention(*a, tree=tree))
  text = jax.export.export(fn, platforms=["cuda"])(q, k, v, pos, tree=mask).mlir_module()
  assert "mosaic_gpu" in text


def test_model_attention_sends_trees_to_the_kernel(monkeypatch):
  # A stand-in for the GPU's decision: the kernel module (its jnp partials) wherever it applies.
  calls = []

  class Kernels:
    supported = staticmethod(lambda q, k, v: True)

    @staticmethod
    def decode_attention(*args, tree=None):
      calls.append(tree)
      return da.decode_attention(*args, tree=tree, partials=da.reference_partials)

  monkeypatch.setattr(attention_ops, "_attention_kernels", lambda: Kernels)
  q, k, v, pos, mask = tree_inputs(3, 8, 2, 64, 256, "wide")
  y = attend(q, k, v, pos, tree=mask)
  assert len(calls) == 1 and np.array_equal(calls[0].root_B, mask.root_B)
  assert rel_err(y, f32_reference(q, k, v, pos, mask)) < TOL


@pytest.mark.gpu
@pytest.mark.parametrize("B,N,K,H,S,config,name", TREE_CASES)
def test_tree_kernel_matches_reference_on_gpu(B, N, K, H, S, config, name):
  q, k, v, pos, mask = tree_inputs(B, N, K, H, S, name)
  assert da.supported(q, k, v)
  args = (q, k, v, pos)
  y = da.decode_attention(*args, tree=mask, config=config)
  y_ref = da.decode_attention(*args, tree=mask, config=config, partials=da.reference_partials)
  assert rel_err(y, y_ref.astype(jnp.float32)) < TOL
  assert rel_err(y, f32_reference(q, k, v, pos, mask)) < TOL
  assert "mosaic_gpu" in jax.jit(attend).lower(q, k, v, pos, tree=mask).as_text()
