"""NVFP4 / FP8 targets: load both layouts, run in the jitted step, match the dequantized twin."""

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.checkpoint.safetensors_io import read_tensors, write_tensors
from specdec.drafters import ngram
from specdec.quant import nvfp4
from specdec.quant.apply import dequantized_twin, quantize_model
from specdec.quant.base import QuantizedWeight
from tests.helpers import tiny_model

X = np.array([[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4]])


@pytest.fixture(scope="module")
def dense():
  return tiny_model(scale=4.0, hidden_size=64, intermediate_size=128)


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_quantized_logits_match_the_dequantized_twin(dense, fmt):
  q = quantize_model(dense, fmt)
  kernel = q.params["params"]["layer_0"]["mlp"]["up_proj"]["kernel"]
  assert isinstance(kernel, QuantizedWeight)
  a, b = np.asarray(q.logits(X)), np.asarray(dequantized_twin(q).logits(X))
  # float32 on both sides; only the summation order inside the dot may differ.
  assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()


@pytest.mark.parametrize("layout", ["modelopt", "compressed-tensors"])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_quantized_checkpoint_round_trips(dense, tmp_path, fmt, layout):
  q = quantize_model(dense, fmt)
  specdec.save(str(tmp_path), q, layout=layout)
  with open(tmp_path / "config.json") as f:
    assert "quantization_config" in json.load(f)
  r = specdec.load(str(tmp_path), dtype=jnp.float32)
  assert isinstance(r.params["params"]["layer_1"]["attn"]["o_proj"]["kernel"], QuantizedWeight)
  assert not isinstance(r.params["params"]["lm_head"]["kernel"], QuantizedWeight)
  np.testing.assert_allclose(np.asarray(r.logits(X)), np.asarray(q.logits(X)), atol=1e-5)
  if fmt == "nvfp4":
    # ModelOpt stores its per-tensor global scale 0-d, compressed-tensors its inverse as [1].
    name, shape = {
      "modelopt": ("weight_scale_2", ()), "compressed-tensors": ("weight_global_scale", (1,))
    }[layout]  # fmt: skip
    t = read_tensors(str(tmp_path / "model.safetensors"))
    assert t[f"model.layers.0.mlp.up_proj.{name}"].shape == shape


def test_a_model_in_the_kernel_bit_order_is_the_same_model(dense, monkeypatch, tmp_path):
  # What load and quantize_model do on a GPU, forced here: every NVFP4 weight in the kernel's
  # bit order; the model computes and saves exactly what the checkpoint-order one does.
  q = quantize_model(dense, "nvfp4")
  monkeypatch.setattr(nvfp4, "device_order", lambda: "kernel")
  k = dataclasses.replace(q, params=nvfp4.for_device(q.params))
  kernel = k.params["params"]["layer_0"]["mlp"]["up_proj"]["kernel"]
  assert kernel.bit_order == "kernel"
  np.testing.assert_array_equal(np.asarray(k.logits(X)), np.asarray(q.logits(X)))
  specdec.save(str(tmp_path / "k"), k)
  specdec.save(str(tmp_path / "q"), q)
  assert (tmp_path / "k" / "model.safetensors").read_bytes() == (
    tmp_path / "q" / "model.safetensors"
  ).read_bytes()
  # The patched order again.
  loaded = specdec.load(str(tmp_path / "k"), dtype=jnp.float32, fuse_projections=False)
  assert loaded.params["params"]["layer_0"]["mlp"]["up_proj"]["kernel"].bit_order == "kernel"
  np.testing.assert_array_equal(np.asarray(loaded.logits(X)), np.asarray(q.logits(X)))


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_greedy_identity_with_a_quantized_target(dense, fmt):
  q = quantize_model(dense, fmt)
  prompts = [[5, 6, 7, 5, 6, 7, 5], [9, 3, 4]]
  base = specdec.generate(q, prompts, max_new_tokens=20).tokens
  assert specdec.generate(q, prompts, max_new_tokens=20, drafter=ngram(), k=4).tokens == base


def test_bad_scale_tensor_is_named(dense, tmp_path):
  specdec.save(str(tmp_path), quantize_model(dense, "nvfp4"), layout="compressed-tensors")
  file = tmp_path / "model.safetensors"
  t = dict(read_tensors(str(file)))
  name = "model.layers.0.mlp.up_proj.weight_scale"
  t[name] = t[name][:, :-1]
  write_tensors(str(file), t)
  with pytest.raises(specdec.CheckpointError, match=name):
    specdec.load(str(tmp_path))


def _random_exl3(model, bits=4, seed=0):
  """EXL3 kernels with random trellis codes: cheap (no Viterbi) and enough to test integration."""
  from flax.traverse_util import flatten_dict, unflatten_dict

  from specdec.quant import exl3

  rng = np.random.default_rng(seed)
  flat = flatten_dict(model.params["params"])
  for key, w in flat.items():
    if key[-1] == "kernel" and key[0] != "lm_head":
      i, o = w.shape
      ip, op = -(-i // 128) * 128, -(-o // 128) * 128
      trellis = rng.integers(-(2**15), 2**15, (ip // 16, op // 16, 16 * bits), dtype=np.int16)
      sign = lambda n: (rng.choice([-1.0, 1.0], n) * 0.15).astype(np.float16)
      flat[key] = exl3.EXL3Weight(
        jnp.asarray(trellis), jnp.asarray(sign(ip)), jnp.asarray(sign(op)), None,
        exl3.Codebook.MUL1, i, o,
      )  # fmt: skip
  return specdec.Model(model.config, {"params": unflatten_dict(flat)}, None, model.dtype)


def test_exl3_target_loads_runs_and_matches_its_twin(dense, tmp_path):
  q = _random_exl3(dense)
  a, b = np.asarray(q.logits(X)), np.asarray(dequantized_twin(q).logits(X))
  assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()
  specdec.save(str(tmp_path), q)
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["quantization_config"]["quant_method"] == "exl3"
  r = specdec.load(str(tmp_path), dtype=jnp.float32)
  np.testing.assert_array_equal(np.asarray(r.logits(X)), a)
  prompts = [[5, 6, 7, 5, 6, 7, 5], [9, 3, 4]]
  base = specdec.generate(r, prompts, max_new_tokens=16).tokens
  assert specdec.generate(r, prompts, max_new_tokens=16, drafter=ngram(), k=3).tokens == base


@pytest.mark.parametrize("fmt, layout", [("nvfp4", "modelopt"), ("fp8", "compressed-tensors")])
def test_zoo_variant_export_reads_back_as_the_same_model(tmp_path, fmt, layout):
  from experiments.export_quant_zoo import export
  from specdec.checkpoint.zoo import resolve_path

  target = specdec.load(resolve_path("zoo:target"), dtype=jnp.bfloat16, fuse_projections=False)
  r = export(target, fmt, str(tmp_path), layout)  # raises if the read-back logits differ
  assert r["path"].endswith(f"target_{fmt}")
  mlp = specdec.load(r["path"]).params["params"]["layer_0"]["mlp"]  # fused at load
  assert isinstance(mlp["gate_up_proj"]["kernel"], QuantizedWeight)
  assert r["mib"] < 14.5  # smaller than the bf16 target's safetensors
