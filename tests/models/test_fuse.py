"""Fused q/k/v and gate/up projections compute what the separate ones do, in every format that can
be fused, and decode the same greedy tokens; EXL3 stays separate; a fused model is not saved."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

import specdec
from specdec.bench.random_models import random_model
from specdec.models.fuse import fuse_projections, quantized
from specdec.quant.apply import quantize_model
from specdec.quant.exl3 import EXL3Weight
from tests.helpers import tiny_config, tiny_model

X = np.array([[5, 9, 2, 7, 7, 1, 30, 4, 11, 2, 3, 60]])


def _modules(model) -> set[str]:
  return {"/".join(k[1:-1]) for k in flatten_dict(model.params["params"]) if k[-1] == "kernel"}


@pytest.mark.parametrize("bias", [False, True])
def test_fused_dense_model_matches_the_separate_one(bias):
  model = tiny_model(attention_bias=bias, mlp_bias=bias)
  fused = fuse_projections(model)
  assert {"attn/qkv_proj", "mlp/gate_up_proj"} <= _modules(fused)
  assert not {"attn/q_proj", "attn/k_proj", "mlp/up_proj"} & _modules(fused)
  np.testing.assert_allclose(fused.logits(X), model.logits(X), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_fused_quantized_model_matches_the_separate_one(fmt):
  q = quantize_model(tiny_model(), fmt)
  fused = fuse_projections(q)
  assert "attn/qkv_proj" in _modules(fused)
  np.testing.assert_allclose(fused.logits(X), q.logits(X), rtol=1e-5, atol=1e-4)


def test_exl3_projections_stay_separate():
  # Random trellis codes of the right shapes: quantizing for real takes half a minute on a CPU.
  q = random_model(tiny_config(hidden_size=128, intermediate_size=256, head_dim=32), "exl3_4")
  assert isinstance(q.params["params"]["layer_0"]["attn"]["q_proj"]["kernel"], EXL3Weight)
  assert _modules(fuse_projections(q)) == _modules(q)


def test_fused_target_decodes_the_same_greedy_tokens():
  model = tiny_model()
  fused = fuse_projections(model)
  ids = [[5, 9, 2, 7, 7, 1, 30, 4]]
  plain = specdec.generate(model, ids, max_new_tokens=24)
  spec = specdec.generate(fused, ids, max_new_tokens=24, drafter=specdec.drafters.ngram(), k=4)
  assert spec.tokens == plain.tokens


def test_a_fused_model_is_not_saved(tmp_path):
  with pytest.raises(ValueError, match="layer_0/attn/qkv_proj.*save the model before fusing"):
    specdec.save(str(tmp_path / "m"), fuse_projections(tiny_model()), dtype=jnp.float32)
  assert not (tmp_path / "m").exists()


def test_load_fuses_by_default_and_keeps_the_checkpoints_modules_on_request():
  from tests.lab.test_sweep import TARGET

  fused = specdec.load(TARGET, dtype=jnp.float32)
  plain = specdec.load(TARGET, dtype=jnp.float32, fuse_projections=False)
  assert {"attn/qkv_proj", "mlp/gate_up_proj"} <= _modules(fused)
  assert {"attn/q_proj", "mlp/up_proj"} <= _modules(plain)
  assert not {"attn/qkv_proj"} & _modules(plain)
  ids = np.array([[1, 5, 9, 2, 7]])
  np.testing.assert_allclose(fused.logits(ids), plain.logits(ids), rtol=1e-5, atol=1e-5)


def test_release_deletes_the_separate_kernels_it_joined():
  model = tiny_model()
  q = model.params["params"]["layer_0"]["attn"]["q_proj"]["kernel"]
  fuse_projections(model, release=True)
  assert q.is_deleted()


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_a_fused_model_quantizes_each_projection_on_its_own(fmt):
  model = tiny_model()
  want = fuse_projections(quantize_model(model, fmt))
  got = quantized(fuse_projections(model), fmt)
  assert _modules(got) == _modules(want)
  for (path, a), b in zip(
    flatten_dict(got.params["params"]).items(),
    flatten_dict(want.params["params"]).values(),
    strict=True,
  ):
    np.testing.assert_array_equal(
      np.asarray(jnp.asarray(a.dequantize(jnp.float32) if hasattr(a, "dequantize") else a)),
      np.asarray(jnp.asarray(b.dequantize(jnp.float32) if hasattr(b, "dequantize") else b)),
      err_msg="/".join(path),
    )


def test_quantize_model_refuses_a_fused_projection():
  with pytest.raises(ValueError, match="layer_0/attn/qkv_proj is a fused projection"):
    quantize_model(fuse_projections(tiny_model()), "fp8")
