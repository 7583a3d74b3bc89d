"""Bad hybrid checkpoints fail with one error naming the file, the tensor or the key."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.checkpoint.safetensors_io import read_tensors
from tests.checkpoint.test_loader_errors import _edit_config, _edit_tensors, _fails
from tests.helpers import copied_checkpoint

SOURCE = "tests/fixtures/hybrid/qwen3_next_moe"  # layers 1 and 3 routed (8 experts), 0 and 2 dense


@pytest.fixture
def ckpt(tmp_path):
  return copied_checkpoint(SOURCE, tmp_path)


def test_loads_with_stacked_experts(ckpt):
  model = specdec.load(ckpt, dtype=jnp.float32)
  experts = model.params["params"]["layer_1"]["mlp"]["experts"]
  assert experts["gate_proj"].shape == (8, 32, 24) and experts["down_proj"].shape == (8, 24, 32)
  raw = read_tensors(os.path.join(ckpt, "model.safetensors"))
  np.testing.assert_array_equal(
    experts["up_proj"][5], raw["model.layers.1.mlp.experts.5.up_proj.weight"].T
  )


@pytest.mark.parametrize("name", ["qwen3_next_dense", "qwen3_next_moe", "qwen3_moe"])
def test_save_writes_the_checkpoint_it_loaded(tmp_path, name):
  source = f"tests/fixtures/hybrid/{name}"
  model = specdec.load(source, dtype=jnp.float32)
  specdec.save(str(tmp_path), model)
  again = specdec.load(str(tmp_path), dtype=jnp.float32)
  assert again.config == model.config
  assert set(read_tensors(f"{tmp_path}/model.safetensors")) == set(
    read_tensors(f"{source}/model.safetensors")
  )  # the experts one tensor each, under HF's names
  for a, b in zip(*(jax.tree.leaves(m.params) for m in (model, again)), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_missing_expert_is_named(ckpt):
  _edit_tensors(ckpt, lambda t: t.pop("model.layers.3.mlp.experts.6.gate_proj.weight"))
  _fails(ckpt, "model.safetensors", "layer 3 gate_proj", "7 of them", "num_experts=8", "[6]")


def test_more_experts_than_the_config_are_refused(ckpt):
  _edit_config(ckpt, lambda d: d.update(num_experts=6))
  _fails(ckpt, "layer 1", "num_experts=6", "unexpected [6, 7]")


def test_a_router_that_disagrees_with_the_expert_count_is_named(ckpt):
  def shrink(t):
    t["model.layers.1.mlp.gate.weight"] = t["model.layers.1.mlp.gate.weight"][:6]

  _edit_tensors(ckpt, shrink)
  _fails(ckpt, "model.layers.1.mlp.gate.weight", "(6, 32)", "expected (8, 32)")


def test_linear_attention_tensors_on_an_attention_layer_are_unexpected(ckpt):
  _edit_tensors(
    ckpt, lambda t: t.update({"model.layers.1.linear_attn.A_log": np.zeros(4, np.float32)})
  )
  _fails(ckpt, "unexpected tensor 'model.layers.1.linear_attn.A_log'")


def test_experts_on_a_dense_layer_are_unexpected(ckpt):
  def add(t):
    t["model.layers.0.mlp.experts.0.up_proj.weight"] = np.zeros((24, 32), np.float32)

  _edit_tensors(ckpt, add)
  _fails(ckpt, "model.layers.0.mlp.experts.0.up_proj.weight", "layer 0 has no routed experts")


def test_a_missing_linear_attention_tensor_is_named(ckpt):
  _edit_tensors(ckpt, lambda t: t.pop("model.layers.2.linear_attn.dt_bias"))
  _fails(ckpt, "missing tensor 'model.layers.2.linear_attn.dt_bias'")


def test_a_layer_schedule_of_the_wrong_length_is_refused(ckpt):
  _edit_config(ckpt, lambda d: d.update(layer_types=["linear_attention", "full_attention"]))
  _fails(ckpt, "config.json", "layer_types has 2 entries but num_hidden_layers=4")
