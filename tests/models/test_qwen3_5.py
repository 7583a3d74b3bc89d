"""Qwen3.5 text models (qwen3_5_text, qwen3_5_moe_text) and the vision-language wrappers they are
published in (qwen3_5, qwen3_5_moe): config parsing, the split Gated DeltaNet projections regrouped
into Qwen3-Next's, the wrapper's language model read alone, and its errors (parity:
test_hybrid_golden.py's fixtures)."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.checkpoint.safetensors_io import read_tensors
from specdec.models.config import VL_WRAPPERS, ConfigError, from_hf_dict
from tests.checkpoint.test_loader_errors import _edit_config, _edit_tensors, _fails
from tests.helpers import copied_checkpoint, hybrid_hf_dict

BASE = hybrid_hf_dict(
  model_type="qwen3_5_text", num_hidden_layers=4, layer_types=None, decoder_sparse_step=None,
  num_experts=None, max_position_embeddings=128,
)  # fmt: skip
MROPE = dict(
  rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5, mrope_section=[2, 1, 1],
  mrope_interleaved=True,
)  # fmt: skip


def test_qwen3_5_is_the_next_family_dense():
  c = from_hf_dict(BASE | dict(rope_parameters=MROPE))
  assert c.layer_types == ("linear_attention",) * 3 + ("full_attention",)
  assert c.moe_layers == (False,) * 4
  assert c.attn_output_gate and c.norm_plus_one and c.rotary_dim == 8  # 0.5 of head_dim 16
  assert c.rope_scaling is None  # M-RoPE on text is plain RoPE


def test_qwen3_5_moe_routes_every_layer_and_renormalizes():
  d = {k: v for k, v in BASE.items() if k != "intermediate_size"}
  c = from_hf_dict(
    d | dict(model_type="qwen3_5_moe_text", num_experts=8, num_experts_per_tok=2,
             moe_intermediate_size=24, shared_expert_intermediate_size=40)
  )  # fmt: skip
  assert c.moe_layers == (True,) * 4 and c.norm_topk_prob and c.intermediate_size == 0
  with pytest.raises(ConfigError, match="qwen3_5_moe_text needs num_experts"):
    from_hf_dict(d | dict(model_type="qwen3_5_moe_text"))


SOURCE = "tests/fixtures/hybrid/qwen3_5_dense"


@pytest.fixture
def ckpt(tmp_path):
  return copied_checkpoint(SOURCE, tmp_path)


def test_split_projections_regroup_by_key_head(ckpt):
  model = specdec.load(ckpt, dtype=jnp.float32)
  raw = read_tensors(os.path.join(ckpt, "model.safetensors"))
  c = model.config
  Q, Y, H, U = (
    c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
    c.linear_value_head_dim,
  )  # fmt: skip
  r = Y // Q
  qkvz = np.asarray(model.params["params"]["layer_0"]["linear_attn"]["in_proj_qkvz"]["kernel"]).T
  group = qkvz.reshape(Q, 2 * H + 2 * r * U, -1)[1]  # key head 1
  qkv, z = (raw[f"model.layers.0.linear_attn.in_proj_{p}.weight"] for p in ("qkv", "z"))
  np.testing.assert_array_equal(group[:H], qkv[H : 2 * H])  # q of key head 1
  np.testing.assert_array_equal(group[H : 2 * H], qkv[Q * H + H : Q * H + 2 * H])  # its k
  v_start = 2 * Q * H + r * U
  np.testing.assert_array_equal(group[2 * H : 2 * H + r * U], qkv[v_start : v_start + r * U])
  np.testing.assert_array_equal(group[2 * H + r * U :], z[r * U : 2 * r * U])  # its z


def test_a_missing_split_projection_is_named(ckpt):
  _edit_tensors(ckpt, lambda t: t.pop("model.layers.1.linear_attn.in_proj_b.weight"))
  _fails(ckpt, f"{ckpt}: missing tensor 'model.layers.1.linear_attn.in_proj_b.weight'")


def test_a_mis_shaped_split_projection_is_named(ckpt):
  def edit(t):
    t["model.layers.2.linear_attn.in_proj_z.weight"] = np.zeros((40, 32), np.float32)

  _edit_tensors(ckpt, edit)
  _fails(ckpt, "'model.layers.2.linear_attn.in_proj_z.weight' has shape (40, 32)", "(48, 32)")


def test_golden_parity_covers_both_qwen3_5_models_and_their_wrappers():
  from tests.models.test_hybrid_golden import FIXTURES, HYBRID, _load

  kinds = {_load(n).config.model_type for n in FIXTURES}
  assert {"qwen3_5_text", "qwen3_5_moe_text"} <= kinds
  wrappers = set()
  for n in FIXTURES:
    with open(os.path.join(HYBRID, n, "config.json")) as f:
      wrappers.add(json.load(f)["model_type"])
  assert set(VL_WRAPPERS) <= wrappers


# --- The vision-language wrapper (Qwen3_5ForConditionalGeneration), read as its language model

WRAPPER = dict(
  model_type="qwen3_5",
  text_config=BASE | dict(rope_parameters=MROPE, tie_word_embeddings=True, eos_token_id=5),
  vision_config=dict(model_type="qwen3_5_vision", depth=1),
  tie_word_embeddings=False,
  image_token_id=248056,
)


def test_wrapper_config_is_its_language_models():
  c = from_hf_dict(WRAPPER)
  assert c == from_hf_dict(WRAPPER["text_config"] | dict(tie_word_embeddings=False))
  assert c.model_type == "qwen3_5_text" and c.eos_token_ids == (5,)
  moe = dict(WRAPPER, model_type="qwen3_5_moe")
  moe["text_config"] = {k: v for k, v in BASE.items() if k != "intermediate_size"} | dict(
    model_type="qwen3_5_moe_text", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8
  )
  assert from_hf_dict(moe).model_type == "qwen3_5_moe_text"


def test_wrapper_level_fields_are_read_where_transformers_reads_them():
  # The wrapper's lm_head ties by the wrapper's tie_word_embeddings (false when absent), whatever
  # text_config says; token ids set on the wrapper win over text_config's.
  assert not from_hf_dict(WRAPPER).tie_word_embeddings
  absent = {k: v for k, v in WRAPPER.items() if k != "tie_word_embeddings"}
  assert not from_hf_dict(absent).tie_word_embeddings
  tied = dict(WRAPPER, tie_word_embeddings=True)
  tied["text_config"] = dict(WRAPPER["text_config"], tie_word_embeddings=False)
  assert from_hf_dict(tied).tie_word_embeddings
  c = from_hf_dict(WRAPPER | dict(eos_token_id=[7, 8], bos_token_id=None))
  assert c.eos_token_ids == (7, 8) and c.bos_token_id is None


def test_wrapper_config_errors_name_the_key():
  no_text = {k: v for k, v in WRAPPER.items() if k != "text_config"}
  with pytest.raises(ConfigError, match="cfg.json: missing config key 'text_config'"):
    from_hf_dict(no_text, source="cfg.json")
  other = dict(WRAPPER, text_config=dict(WRAPPER["text_config"], model_type="qwen3_5_moe_text"))
  with pytest.raises(ConfigError, match="text_config.model_type 'qwen3_5_moe_text' is not"):
    from_hf_dict(other)
  no_width = dict(WRAPPER, text_config=dict(WRAPPER["text_config"], hidden_size=None))
  with pytest.raises(ConfigError, match="cfg.json text_config: missing config key 'hidden_size'"):
    from_hf_dict(no_width, source="cfg.json")


VL = "tests/fixtures/hybrid/qwen3_5_vl"
VL_MOE = "tests/fixtures/hybrid/qwen3_5_moe_vl"
LM = "model.language_model."


@pytest.fixture
def vl(tmp_path):
  return copied_checkpoint(VL, tmp_path)


def test_wrapper_fixtures_tie_by_the_wrappers_flag_and_ship_a_vision_tower():
  # (their logits and greedy continuations: test_hybrid_golden.py)
  for path, tied in ((VL, True), (VL_MOE, False)):
    with open(os.path.join(path, "config.json")) as f:
      d = json.load(f)
    assert d["model_type"] in VL_WRAPPERS and d["text_config"]["tie_word_embeddings"] != tied
    assert specdec.load(path, dtype=jnp.float32).config.tie_word_embeddings == tied
    raw = read_tensors(os.path.join(path, "model.safetensors"))
    assert any(n.startswith("model.visual.") for n in raw) and ("lm_head.weight" in raw) != tied


def test_the_vision_tower_is_not_read(vl):
  def edit(t):  # neither shape nor dtype of a vision tensor is looked at
    t["model.visual.merger.norm.weight"] = np.zeros(3, np.int32)
    t["model.visual.unheard_of"] = np.zeros(2, np.float32)

  _edit_tensors(vl, edit)
  specdec.load(vl, dtype=jnp.float32)


def test_a_wrapper_without_text_config_is_named(vl):
  _edit_config(vl, lambda d: d.pop("text_config"))
  _fails(vl, os.path.join(vl, "config.json"), "missing config key 'text_config'")


@pytest.mark.parametrize(
  "name",
  [LM + "norm.weight", LM + "layers.3.self_attn.q_norm.weight", LM + "embed_tokens.weight"],
)
def test_a_missing_language_model_tensor_is_named_as_stored(vl, name):
  _edit_tensors(vl, lambda t: t.pop(name))
  _fails(vl, vl, f"missing tensor {name!r}")


def test_a_missing_split_projection_of_the_wrapper_is_named(vl):
  _edit_tensors(vl, lambda t: t.pop(LM + "layers.2.linear_attn.in_proj_qkv.weight"))
  _fails(vl, f"missing tensor '{LM}layers.2.linear_attn.in_proj_qkv.weight'")


def test_a_missing_router_or_expert_of_the_moe_wrapper_is_named(tmp_path):
  ckpt = copied_checkpoint(VL_MOE, tmp_path)
  router = LM + "layers.1.mlp.gate.weight"
  _edit_tensors(ckpt, lambda t: t.pop(router))
  _fails(ckpt, ckpt, f"missing tensor {router!r}")
  ckpt = copied_checkpoint(VL_MOE, tmp_path / "b")
  _edit_tensors(ckpt, lambda t: t.pop(LM + "layers.0.mlp.experts.3.up_proj.weight"))
  _fails(ckpt, "model.safetensors", f"missing tensor '{LM}layers.0.mlp.experts.3.up_proj.weight'")


def test_a_mis_shaped_language_model_tensor_is_named(vl):
  name = LM + "layers.1.post_attention_layernorm.weight"
  _edit_tensors(vl, lambda t: t.update({name: np.ones(31, np.float32)}))
  _fails(vl, "model.safetensors", f"{name!r} has shape (31,)")


def test_text_layout_names_in_a_wrapper_are_unexpected(vl):
  _edit_tensors(vl, lambda t: t.update({"model.norm.weight": t.pop(LM + "norm.weight")}))
  _fails(vl, "model.safetensors", "unexpected tensor 'model.norm.weight'", repr(LM))
