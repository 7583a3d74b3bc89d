"""Qwen3.5 text models (qwen3_5_text, qwen3_5_moe_text): config parsing and the split Gated
DeltaNet projections regrouped into Qwen3-Next's (parity: test_hybrid_golden.py's fixtures)."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.checkpoint.safetensors_io import read_tensors
from specdec.models.config import ConfigError, from_hf_dict
from tests.checkpoint.test_loader_errors import _edit_tensors, _fails
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
  _fails(ckpt, "missing tensor 'model.layers.1.linear_attn.in_proj_b.weight'")


def test_a_mis_shaped_split_projection_is_named(ckpt):
  def edit(t):
    t["model.layers.2.linear_attn.in_proj_z.weight"] = np.zeros((40, 32), np.float32)

  _edit_tensors(ckpt, edit)
  _fails(ckpt, "'model.layers.2.linear_attn.in_proj_z.weight' has shape (40, 32)", "(48, 32)")


def test_golden_parity_covers_both_qwen3_5_models():
  from tests.models.test_hybrid_golden import FIXTURES, _load

  kinds = {_load(n).config.model_type for n in FIXTURES}
  assert {"qwen3_5_text", "qwen3_5_moe_text"} <= kinds
