"""Bad checkpoints fail with one clear error naming the file and the tensor; nothing is returned."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.checkpoint.safetensors_io import read_tensors, write_tensors
from tests.helpers import tiny_model


@pytest.fixture
def ckpt(tmp_path):
  path = str(tmp_path / "m")
  specdec.save(path, tiny_model(), dtype=jnp.bfloat16)
  return path


def _edit_tensors(path, fn):
  file = os.path.join(path, "model.safetensors")
  tensors = dict(read_tensors(file))
  fn(tensors)
  write_tensors(file, tensors)


def _edit_config(path, fn):
  file = os.path.join(path, "config.json")
  with open(file) as f:
    d = json.load(f)
  fn(d)
  with open(file, "w") as f:
    json.dump(d, f)


def _fails(path, *fragments):
  with pytest.raises(specdec.CheckpointError) as e:
    specdec.load(path)
  for frag in fragments:
    assert frag in str(e.value), str(e.value)


def test_round_trip_loads(ckpt):
  m = specdec.load(ckpt, dtype=jnp.float32)
  ref = tiny_model()
  a = np.asarray(m.params["params"]["layer_1"]["mlp"]["down_proj"]["kernel"])
  b = np.asarray(ref.params["params"]["layer_1"]["mlp"]["down_proj"]["kernel"], np.float32)
  np.testing.assert_allclose(a, b, rtol=1e-2)


def test_missing_tensor(ckpt):
  _edit_tensors(ckpt, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
  _fails(ckpt, "missing tensor", "model.layers.1.self_attn.k_proj.weight")


def test_unexpected_tensor(ckpt):
  _edit_tensors(ckpt, lambda t: t.update({"model.layers.7.mlp.up_proj.weight": np.zeros((2, 2))}))
  _fails(ckpt, "model.safetensors", "unexpected tensor", "model.layers.7.mlp.up_proj.weight")


def test_misshapen_tensor(ckpt):
  _edit_tensors(ckpt, lambda t: t.update({"model.norm.weight": np.ones((47,), np.float32)}))
  _fails(ckpt, "model.safetensors", "model.norm.weight", "(47,)", "(48,)")


def test_wrong_dtype_tensor(ckpt):
  _edit_tensors(ckpt, lambda t: t.update({"model.norm.weight": np.ones((48,), np.int32)}))
  _fails(ckpt, "model.norm.weight", "int32")


def test_missing_config_key(ckpt):
  _edit_config(ckpt, lambda d: d.pop("num_hidden_layers"))
  _fails(ckpt, "config.json", "num_hidden_layers")


def test_unknown_model_type(ckpt):
  _edit_config(ckpt, lambda d: d.update(model_type="gpt2"))
  _fails(ckpt, "config.json", "unknown model_type", "gpt2")


def test_truncated_safetensors(ckpt):
  file = os.path.join(ckpt, "model.safetensors")
  size = os.path.getsize(file)
  with open(file, "r+b") as f:
    f.truncate(size - 100)
  _fails(ckpt, "model.safetensors", "truncated")


def test_corrupt_safetensors_header(ckpt):
  file = os.path.join(ckpt, "model.safetensors")
  with open(file, "r+b") as f:
    f.seek(8)
    f.write(b"#garbage#")
  _fails(ckpt, "model.safetensors", "corrupt")


def test_tokenizer_larger_than_embedding(ckpt):
  shutil.copy(
    "tests/fixtures/golden/qwen3_gqa/tokenizer.json", os.path.join(ckpt, "tokenizer.json")
  )
  _fails(ckpt, "tokenizer.json", "vocab_size=64")


def test_missing_shard(tmp_path):
  path = str(tmp_path / "sharded")
  shutil.copytree("tests/fixtures/golden/llama_sharded", path)
  os.remove(os.path.join(path, "model-00002-of-00002.safetensors"))
  _fails(path, "model-00002-of-00002.safetensors", "missing")


def test_not_a_checkpoint(tmp_path):
  _fails(str(tmp_path), "config.json", "not found")


def test_generation_config_eos_ids_are_read(ckpt):
  with open(os.path.join(ckpt, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [3, 5]}, f)
  assert specdec.load(ckpt).config.eos_token_ids == (3, 5)
