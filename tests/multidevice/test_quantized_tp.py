"""Quantized matmuls under a tensor axis on the fake 4-device CPU mesh: each device runs the
dispatch (XLA's path here, the kernel where it applies) over its own shard inside `shard_map`,
column splits with no reduction and row splits with a psum, so sharded NVFP4 / FP8 / EXL3 targets
give the single-device logits at TP = 2 and 4, and greedy output (each format at one of them)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec import sharding
from specdec.drafters import ngram
from specdec.ops import qmatmul
from specdec.quant import exl3, fp8, nvfp4
from specdec.quant.apply import quantize_model
from tests.helpers import random_exl3, tiny_model

PROMPTS = [[5, 9, 13, 2, 7, 7, 31], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]]
# float32 logits: a row split sums its partial outputs across devices in f32, in another order
# than one device's dot.
TOL = 1e-5
FORMATS = ("nvfp4", "fp8", "exl3")
# The field that holds a weight's codes, and its spec when the weight splits by input features.
ROW_SPLIT_CODES = {
  "nvfp4": ("packed_NP", (None, "tensor")),
  "fp8": ("codes_NK", (None, "tensor")),
  "exl3": ("trellis", ("tensor", None, None)),
}


def _weight(fmt: str, k: int, n: int, seed: int = 0):
  """A quantized (k, n) weight: NVFP4 / FP8 of a random matrix, EXL3 of random codes with a bias
  (the bias a row split must add once)."""
  key = jax.random.key(seed)
  if fmt == "exl3":
    return exl3.random_weight(key, k, n, 4, bias=True)
  quantize = {"nvfp4": nvfp4.quantize, "fp8": fp8.quantize}[fmt]
  return quantize(jax.random.normal(key, (k, n), jnp.float32))


@functools.cache
def _target(fmt: str):
  if fmt == "exl3":
    # Every split dimension 512: whole 128-point Hadamard blocks over 2 and 4 devices.
    dims = dict(head_dim=128, intermediate_size=512, hidden_size=64)
    return random_exl3(tiny_model(num_attention_heads=4, num_key_value_heads=4, **dims))
  # MLP width 128: down_proj's K splits into whole 16-wide NVFP4 groups over 2 and 4 devices.
  model = tiny_model(num_attention_heads=4, num_key_value_heads=4, intermediate_size=128)
  return quantize_model(model, fmt)


def _placed(w, split, mesh):
  specs = sharding.quantized_specs(w, split, mesh.shape["tensor"], "w")
  return jax.device_put(w, sharding.shardings_of(specs, mesh))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("split", ["columns", "rows"])
def test_a_split_quantized_matmul_runs_per_device_and_sums_only_row_splits(fmt, split):
  # 512 x 512: EXL3 shards of whole 128-blocks on either side over 4 devices.
  w = _weight(fmt, 512, 512)
  x = jax.random.normal(jax.random.key(1), (2, 3, 512), jnp.float32)
  mesh = sharding.make_mesh(tensor=4)
  f = jax.jit(lambda x, w: qmatmul.matmul(x, w, split=split))
  with jax.set_mesh(mesh):
    placed = _placed(w, split, mesh)
    y = f(x, placed)
    text = str(jax.make_jaxpr(f)(x, placed))
  assert "shard_map" in text and ("psum" in text) == (split == "rows")
  assert y.shape == (2, 3, 512)
  want = qmatmul.xla_matmul(x, w)
  np.testing.assert_allclose(y, want, atol=TOL * np.abs(want).max(), rtol=TOL)
  assert qmatmul.by_tensor(f, w, split) is f  # no context mesh: the matmul as is


@pytest.mark.parametrize("fmt", ["nvfp4", "exl3"])
@pytest.mark.parametrize("split", ["columns", "rows"])
def test_the_kernel_path_gets_its_device_shard_inside_shard_map(monkeypatch, fmt, split):
  # The kernel's jnp reference stands in for the Pallas call, which the CPU cannot run; it
  # records the shard each device passes it (an EXL3 one with its bias only in a column split).
  from kernels_pallas import exl3_gemv, nvfp4_gemv

  gemv, weight_type = {
    "nvfp4": (nvfp4_gemv, nvfp4.NVFP4Weight),
    "exl3": (exl3_gemv, exl3.EXL3Weight),
  }[fmt]
  seen = []

  def stand_in(x_MK, w):
    seen.append((x_MK.shape, w.shape))
    return gemv.reference(x_MK, w)

  monkeypatch.setitem(qmatmul.KERNELS, weight_type, qmatmul.Kernel(stand_in, gemv.check_shape))
  key = jax.random.key(0)
  w = nvfp4.random_weight(key, 256, 256) if fmt == "nvfp4" else _weight(fmt, 256, 256)
  x = jax.random.normal(jax.random.key(1), (4, 256), jnp.bfloat16)
  mesh = sharding.make_mesh(tensor=2)
  with jax.set_mesh(mesh):
    y = jax.jit(lambda x, w: qmatmul.matmul(x, w, implementation="mosaic", split=split))(
      x, _placed(w, split, mesh)
    )
  assert seen == [((4, 256), (256, 128))] if split == "columns" else [((4, 128), (128, 256))]
  want = gemv.reference(x, w).astype(jnp.float32)
  np.testing.assert_allclose(y.astype(jnp.float32), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@pytest.mark.parametrize("fmt", ["nvfp4", "exl3"])
@pytest.mark.parametrize("split", ["columns", "rows"])
def test_the_split_kernel_lowers_for_cuda_inside_shard_map(fmt, split):
  # The Mosaic GPU lowering runs on a CPU: the kernel, not XLA's dot, inside the per-device map.
  key = jax.random.key(0)
  w = nvfp4.random_weight(key, 1024, 512) if fmt == "nvfp4" else _weight(fmt, 1024, 512)
  x = jnp.ones((4, 1024), jnp.bfloat16)
  mesh = sharding.make_mesh(tensor=2)
  f = jax.jit(lambda x, w: qmatmul.matmul(x, w, implementation="mosaic", split=split))
  with jax.set_mesh(mesh):
    text = jax.export.export(f, platforms=["cuda"])(x, _placed(w, split, mesh)).mlir_module()
  assert "mosaic_gpu" in text and ("all_reduce" in text) == (split == "rows")


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("fmt", FORMATS)
def test_sharded_quantized_targets_give_the_single_device_logits(fmt, tp):
  q = _target(fmt)
  mesh = sharding.make_mesh(tensor=tp)
  sharded = sharding.on_mesh(q, mesh)
  down = sharded.params["params"]["layer_0"]["mlp"]["down_proj"]["kernel"]
  field, spec = ROW_SPLIT_CODES[fmt]
  assert tuple(getattr(down, field).sharding.spec) == spec  # row split: by input features
  tokens = np.array([p[:7] for p in PROMPTS], np.int32)
  with jax.set_mesh(mesh):
    got = sharded.logits(tokens)
    assert "shard_map" in str(jax.make_jaxpr(sharded.logits)(tokens))
  want = q.logits(tokens)
  np.testing.assert_allclose(got, want, atol=TOL * np.abs(want).max(), rtol=TOL)


# Each format decodes at one degree, both degrees covered (the logits above check both for each).
@pytest.mark.parametrize("fmt, tp", [("nvfp4", 4), ("fp8", 2), ("exl3", 4)])
def test_sharded_quantized_targets_give_the_single_device_greedy_output(fmt, tp):
  q = _target(fmt)
  kw = dict(max_new_tokens=10, drafter=ngram(), k=3)
  want = specdec.generate(q, PROMPTS, **kw).tokens
  assert specdec.generate(q, PROMPTS, mesh=sharding.make_mesh(tensor=tp), **kw).tokens == want


def test_a_degree_that_cuts_nvfp4_groups_names_the_tensor_and_the_degree():
  # down_proj's K = 128 over 4 devices is 32 wide (whole groups); 96 over 4 is 24 wide.
  q = quantize_model(tiny_model(num_attention_heads=4, num_key_value_heads=4), "nvfp4")
  cut = r"params/layer_0/mlp/down_proj/kernel: K=96 over tensor=4 gives 24-wide shards"
  with pytest.raises(sharding.ShardingError, match=cut):
    sharding.param_specs(q.params, q.config, 4)


def test_an_exl3_split_that_cuts_a_hadamard_block_names_the_tensor_its_shape_and_the_degree():
  # Attention 4 x 128 wide splits into whole 128-blocks over 2 devices; down_proj's input 384
  # gives 192-wide shards (a row split), and q_proj's output 64 of the small model 32-wide ones.
  dims = dict(head_dim=128, intermediate_size=384, hidden_size=64)
  q = random_exl3(tiny_model(num_attention_heads=4, num_key_value_heads=4, **dims))
  rows = (
    r"params/layer_0/mlp/down_proj/kernel: EXL3 weight \(in, out\) = \(384, 64\), rows split "
    r"over tensor=2: in_features=384 gives 192-wide shards; each must be a multiple of EXL3's "
    r"128-point Hadamard block \(in_features a multiple of 256\)"
  )
  with pytest.raises(sharding.ShardingError, match=rows):
    sharding.param_specs(q.params, q.config, 2)
  small = random_exl3(tiny_model(num_attention_heads=4, num_key_value_heads=4))
  columns = r"params/layer_0/attn/k_proj/kernel: EXL3 weight \(in, out\) = \(48, 64\), columns"
  with pytest.raises(sharding.ShardingError, match=columns):
    specdec.generate(small, PROMPTS, max_new_tokens=2, mesh=sharding.make_mesh(tensor=2))
