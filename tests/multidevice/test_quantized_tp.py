"""Quantized matmuls under a tensor axis on the fake 4-device CPU mesh: each device runs the
dispatch (XLA's path here, the kernel where it applies) over its own shard inside `shard_map`,
column splits with no reduction and row splits with a psum, so sharded NVFP4 / FP8 targets give
the single-device logits and greedy output, TP = 2 and 4."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec import sharding
from specdec.drafters import ngram
from specdec.ops import qmatmul
from specdec.quant import fp8, nvfp4
from specdec.quant.apply import quantize_model
from tests.helpers import tiny_model

PROMPTS = [[5, 9, 13, 2, 7, 7, 31], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]]
# float32 logits: a row split sums its partial outputs across devices in f32, in another order
# than one device's dot.
TOL = 1e-5
QUANTIZE = {"nvfp4": nvfp4.quantize, "fp8": fp8.quantize}


@pytest.fixture(scope="module")
def model():
  # MLP width 128: down_proj's K splits into whole 16-wide NVFP4 groups over 2 and 4 devices.
  return tiny_model(num_attention_heads=4, num_key_value_heads=4, intermediate_size=128)


def _placed(w, split, mesh):
  specs = sharding.quantized_specs(w, split, mesh.shape["tensor"], "w")
  return jax.device_put(w, sharding.shardings_of(specs, mesh))


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("split", ["columns", "rows"])
def test_a_split_quantized_matmul_runs_per_device_and_sums_only_row_splits(fmt, split):
  w = QUANTIZE[fmt](jax.random.normal(jax.random.key(0), (128, 64), jnp.float32))
  x = jax.random.normal(jax.random.key(1), (2, 3, 128), jnp.float32)
  mesh = sharding.make_mesh(tensor=4)
  f = jax.jit(lambda x, w: qmatmul.matmul(x, w, split=split))
  with jax.set_mesh(mesh):
    placed = _placed(w, split, mesh)
    y = f(x, placed)
    text = str(jax.make_jaxpr(f)(x, placed))
  assert "shard_map" in text and ("psum" in text) == (split == "rows")
  assert y.shape == (2, 3, 64)
  np.testing.assert_allclose(y, qmatmul.xla_matmul(x, w), atol=TOL * 10, rtol=TOL)
  assert qmatmul.by_tensor(f, w, split) is f  # no context mesh: the matmul as is


@pytest.mark.parametrize("split", ["columns", "rows"])
def test_the_kernel_path_gets_its_device_shard_inside_shard_map(monkeypatch, split):
  # The kernel's jnp reference stands in for the Pallas call, which the CPU cannot run; it
  # records the shard each device passes it.
  from kernels_pallas import nvfp4_gemv

  seen = []

  def stand_in(x_MK, w):
    seen.append((x_MK.shape, w.shape))
    return nvfp4_gemv.reference(x_MK, w)

  monkeypatch.setitem(
    qmatmul.KERNELS, nvfp4.NVFP4Weight, qmatmul.Kernel(stand_in, nvfp4_gemv.check_shape)
  )
  w = nvfp4.random_weight(jax.random.key(0), 256, 64)
  x = jax.random.normal(jax.random.key(1), (4, 256), jnp.bfloat16)
  mesh = sharding.make_mesh(tensor=2)
  with jax.set_mesh(mesh):
    y = jax.jit(lambda x, w: qmatmul.matmul(x, w, implementation="mosaic", split=split))(
      x, _placed(w, split, mesh)
    )
  assert seen == [((4, 256), (256, 32))] if split == "columns" else [((4, 128), (128, 64))]
  want = nvfp4_gemv.reference(x, w).astype(jnp.float32)
  np.testing.assert_allclose(y.astype(jnp.float32), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@pytest.mark.parametrize("split", ["columns", "rows"])
def test_the_split_nvfp4_kernel_lowers_for_cuda_inside_shard_map(split):
  # The Mosaic GPU lowering runs on a CPU: the kernel, not XLA's dot, inside the per-device map.
  w = nvfp4.random_weight(jax.random.key(0), 1024, 512)
  x = jnp.ones((4, 1024), jnp.bfloat16)
  mesh = sharding.make_mesh(tensor=2)
  f = jax.jit(lambda x, w: qmatmul.matmul(x, w, implementation="mosaic", split=split))
  with jax.set_mesh(mesh):
    text = jax.export.export(f, platforms=["cuda"])(x, _placed(w, split, mesh)).mlir_module()
  assert "mosaic_gpu" in text and ("all_reduce" in text) == (split == "rows")


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_sharded_quantized_targets_match_the_single_device_target(model, fmt, tp):
  q = quantize_model(model, fmt)
  mesh = sharding.make_mesh(tensor=tp)
  sharded = sharding.on_mesh(q, mesh)
  down = sharded.params["params"]["layer_0"]["mlp"]["down_proj"]["kernel"]
  codes = down.packed_NP if fmt == "nvfp4" else down.codes_NK
  assert tuple(codes.sharding.spec) == (None, "tensor")  # row split: by input features
  tokens = np.array([p[:7] for p in PROMPTS], np.int32)
  with jax.set_mesh(mesh):
    got = sharded.logits(tokens)
    assert "shard_map" in str(jax.make_jaxpr(sharded.logits)(tokens))
  np.testing.assert_allclose(got, q.logits(tokens), atol=TOL, rtol=TOL)
  kw = dict(max_new_tokens=10, drafter=ngram(), k=3)
  want = specdec.generate(q, PROMPTS, **kw).tokens
  assert specdec.generate(q, PROMPTS, mesh=mesh, **kw).tokens == want


def test_a_degree_that_cuts_nvfp4_groups_names_the_tensor_and_the_degree(model):
  # down_proj's K = 128 over 4 devices is 32 wide (whole groups); 96 over 4 is 24 wide.
  q = quantize_model(tiny_model(num_attention_heads=4, num_key_value_heads=4), "nvfp4")
  cut = r"params/layer_0/mlp/down_proj/kernel: K=96 over tensor=4 gives 24-wide shards"
  with pytest.raises(sharding.ShardingError, match=cut):
    sharding.param_specs(q.params, q.config, 4)
  with pytest.raises(sharding.ShardingError, match="EXL3Weight weights cannot be split"):
    sharding.on_mesh(quantize_model(model, "exl3_4"), sharding.make_mesh(tensor=2))
