"""The golden parity fixtures are complete and agree with themselves (numpy only, no torch).

This does not test our model; it guards the fixtures against partial regeneration, hand edits and
a broken checkout (e.g. files replaced by LFS pointers).
"""

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest

GOLDEN = Path(__file__).parents[1] / "fixtures" / "golden"
NAMES = ["qwen3_gqa", "qwen3_tied", "llama_bias", "qwen3_yarn", "llama_sharded"]
SAFETENSORS_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2}


def read_safetensors_header(path: Path) -> tuple[dict, int]:
  """The tensor table and the data size, parsed by hand so no framework is needed."""
  raw = path.read_bytes()
  (n,) = struct.unpack("<Q", raw[:8])
  header = json.loads(raw[8 : 8 + n])
  header.pop("__metadata__", None)
  return header, len(raw) - 8 - n


def load(name: str):
  path = GOLDEN / name
  config = json.loads((path / "config.json").read_text())
  meta = json.loads((path / "meta.json").read_text())
  ref = dict(np.load(path / "reference.npz"))
  return path, config, meta, ref


def all_tensors(path: Path) -> dict:
  index = path / "model.safetensors.index.json"
  files = (
    sorted(set(json.loads(index.read_text())["weight_map"].values()))
    if index.exists()
    else ["model.safetensors"]
  )
  tensors = {}
  for f in files:
    header, data_size = read_safetensors_header(path / f)
    end = max(t["data_offsets"][1] for t in header.values())
    assert end == data_size, f"{f}: header says {end} data bytes, file has {data_size}"
    for k, t in header.items():
      assert k not in tensors, f"{k} in two shards"
      tensors[k] = t
  return tensors


@pytest.mark.parametrize("name", NAMES)
def test_files_present(name):
  path = GOLDEN / name
  for f in [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "reference.npz",
    "meta.json",
  ]:
    assert (path / f).is_file(), f
  meta = json.loads((path / "meta.json").read_text())
  for f, digest in meta["sha256"].items():
    assert hashlib.sha256((path / f).read_bytes()).hexdigest() == digest, f
  assert sorted(p.name for p in path.glob("*.safetensors")) == meta["weight_files"]


@pytest.mark.parametrize("name", NAMES)
def test_reference_shapes(name):
  _, config, meta, ref = load(name)
  vocab = config["vocab_size"]
  assert ref["input_ids"].shape == (2, 24) and ref["input_ids"].dtype == np.int32
  assert ref["logits"].shape == (2, 24, vocab) and ref["logits"].dtype == np.float32
  assert ref["prompt"].shape == (1, 8) and ref["prompt"].dtype == np.int32
  assert ref["greedy"].shape == (1, 32) and ref["greedy"].dtype == np.int32
  assert ref["greedy_logits"].shape == (32, vocab) and ref["greedy_logits"].dtype == np.float32
  for k in ["input_ids", "prompt", "greedy"]:
    assert ref[k].min() >= 0 and ref[k].max() < vocab, k
  assert np.isfinite(ref["logits"]).all() and np.isfinite(ref["greedy_logits"]).all()
  assert meta["generation"]["eos_in_greedy"] == bool(
    (ref["greedy"] == config["eos_token_id"]).any()
  )


@pytest.mark.parametrize("name", NAMES)
def test_greedy_matches_its_logits(name):
  _, _, meta, ref = load(name)
  np.testing.assert_array_equal(ref["greedy_logits"].argmax(-1), ref["greedy"][0])
  top = np.sort(ref["greedy_logits"], axis=-1)[:, -2:]
  gaps = top[:, 1] - top[:, 0]
  np.testing.assert_allclose(gaps.min(), meta["min_top2_gap_greedy"], rtol=1e-6)
  # A fixture whose greedy path has near-ties cannot judge a bf16 run.
  assert gaps.min() > 0.05
  assert len(np.unique(ref["greedy"])) >= 16, "greedy continuation collapsed into a loop"


@pytest.mark.parametrize("name", NAMES)
def test_weights_match_config(name):
  path, config, meta, _ = load(name)
  tensors = all_tensors(path)
  want_dtype = SAFETENSORS_DTYPE[meta["storage_dtype"]]
  for k, t in tensors.items():
    assert t["dtype"] == want_dtype, (k, t["dtype"])
    start, end = t["data_offsets"]
    assert end - start == int(np.prod(t["shape"])) * DTYPE_BYTES[t["dtype"]], k

  vocab, hidden = config["vocab_size"], config["hidden_size"]
  heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
  head_dim = config.get("head_dim") or hidden // heads
  inter = config["intermediate_size"]
  assert tensors["model.embed_tokens.weight"]["shape"] == [vocab, hidden]
  assert tensors["model.norm.weight"]["shape"] == [hidden]
  if config["tie_word_embeddings"]:
    assert "lm_head.weight" not in tensors
  else:
    assert tensors["lm_head.weight"]["shape"] == [vocab, hidden]

  # HF linear weights are stored (out, in).
  expected = {}
  for i in range(config["num_hidden_layers"]):
    p = f"model.layers.{i}."
    expected |= {
      p + "input_layernorm.weight": [hidden],
      p + "post_attention_layernorm.weight": [hidden],
      p + "self_attn.q_proj.weight": [heads * head_dim, hidden],
      p + "self_attn.k_proj.weight": [kv_heads * head_dim, hidden],
      p + "self_attn.v_proj.weight": [kv_heads * head_dim, hidden],
      p + "self_attn.o_proj.weight": [hidden, heads * head_dim],
      p + "mlp.gate_proj.weight": [inter, hidden],
      p + "mlp.up_proj.weight": [inter, hidden],
      p + "mlp.down_proj.weight": [hidden, inter],
    }
    if config["model_type"] == "qwen3":
      expected |= {
        p + "self_attn.q_norm.weight": [head_dim],
        p + "self_attn.k_norm.weight": [head_dim],
      }
    if config.get("attention_bias"):
      expected |= {
        p + "self_attn.q_proj.bias": [heads * head_dim],
        p + "self_attn.k_proj.bias": [kv_heads * head_dim],
        p + "self_attn.v_proj.bias": [kv_heads * head_dim],
        p + "self_attn.o_proj.bias": [hidden],
      }
  layer_tensors = {k: t["shape"] for k, t in tensors.items() if k.startswith("model.layers.")}
  assert layer_tensors == expected


def test_sharded_fixture_has_two_shards():
  path = GOLDEN / "llama_sharded"
  weight_map = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
  assert len(set(weight_map.values())) == 2
  assert not (path / "model.safetensors").exists()
  for key, f in weight_map.items():
    header, _ = read_safetensors_header(path / f)
    assert key in header, (key, f)


@pytest.mark.parametrize("name", NAMES)
def test_config_dialect(name):
  _, config, meta, _ = load(name)
  if meta["config_format"] == "legacy":
    assert "rope_parameters" not in config and "rope_theta" in config and "torch_dtype" in config
    rope = config["rope_scaling"] or {}
  else:
    assert "rope_parameters" in config and "rope_scaling" not in config
    rope = config["rope_parameters"]
  rope_type = rope.get("rope_type", "default")
  assert rope_type == {"llama_bias": "llama3", "qwen3_yarn": "yarn"}.get(name, "default")


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_fits_vocab(name):
  path, config, _, _ = load(name)
  tok = json.loads((path / "tokenizer.json").read_text())
  ids = set(tok["model"]["vocab"].values()) | {t["id"] for t in tok["added_tokens"]}
  assert max(ids) < config["vocab_size"]
  assert {t["content"]: t["id"] for t in tok["added_tokens"]} == {"<|endoftext|>": 0, "<|pad|>": 1}


def test_sizes():
  total = sum(p.stat().st_size for p in GOLDEN.rglob("*") if p.is_file())
  assert total < 3_000_000
  for name in NAMES:
    weights = sum(p.stat().st_size for p in (GOLDEN / name).glob("*.safetensors"))
    assert weights < 300_000, name
