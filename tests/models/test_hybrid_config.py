"""Qwen3-Next / Qwen3-MoE config.json parsing: the fields it fills and the misfits it refuses."""

import pytest

from specdec.models.config import ConfigError, HybridConfig, from_hf_dict
from tests.helpers import hybrid_hf_dict, tiny_hybrid_config

# The family's default schedule (3 GDN : 1 attention) over 4 layers, experts on every layer.
BASE = hybrid_hf_dict(
  num_hidden_layers=4, layer_types=None, decoder_sparse_step=None, num_experts=8,
  max_position_embeddings=128, shared_expert_intermediate_size=24,
)  # fmt: skip


def test_qwen3_next_defaults_follow_the_family():
  c = from_hf_dict(BASE)
  assert isinstance(c, HybridConfig)
  assert c.layer_types == ("linear_attention",) * 3 + ("full_attention",)
  assert c.linear_layers == (0, 1, 2) and c.attention_layers == (3,)
  assert c.moe_layers == (True,) * 4
  assert c.rotary_dim == 4  # partial_rotary_factor 0.25 of head_dim 16
  assert c.attn_output_gate and c.norm_plus_one and c.qk_norm
  assert c.conv_dim == 2 * 2 * 8 + 4 * 8
  hash(c)  # a static argument of the step


def test_sparse_step_and_dense_only_layers_pick_the_moe_layers():
  c = from_hf_dict(BASE | dict(decoder_sparse_step=2, mlp_only_layers=[3]))
  assert c.moe_layers == (False, True, False, False)
  assert from_hf_dict(BASE | dict(num_experts=0)).moe_layers == (False,) * 4


def test_qwen3_moe_is_all_attention_with_full_rope():
  c = from_hf_dict(BASE | dict(model_type="qwen3_moe", shared_expert_intermediate_size=None))
  assert c.layer_types == ("full_attention",) * 4 and c.linear_layers == ()
  assert c.rotary_dim == 16 and not c.attn_output_gate and not c.norm_plus_one
  assert c.shared_expert_intermediate_size == 0


def test_partial_rotary_factor_is_read_from_either_dialect():
  legacy = from_hf_dict(BASE | dict(partial_rotary_factor=0.5))
  v5 = from_hf_dict(BASE | dict(rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.5}))
  assert legacy.rotary_dim == v5.rotary_dim == 8


@pytest.mark.parametrize(
  "change, message",
  [
    (
      dict(layer_types=["linear_attention", "full_attention"]),
      "layer_types has 2 entries but num_hidden_layers=4",
    ),
    (
      dict(layer_types=["linear_attention", "mamba", "linear_attention", "full_attention"]),
      r"layer_types\[1\] = 'mamba'",
    ),
    (
      dict(linear_num_value_heads=3),
      "linear_num_value_heads=3 is not a multiple of linear_num_key_heads=2",
    ),
    (dict(linear_key_head_dim=0), "linear_key_head_dim"),
    (dict(num_experts_per_tok=9), r"num_experts_per_tok=9 must be in \[1, num_experts=8\]"),
    (dict(moe_intermediate_size=None), "moe_intermediate_size"),
    (dict(partial_rotary_factor=0.1), "rotary dim 1 of head_dim 16"),
    (
      dict(model_type="qwen3_moe", layer_types=["linear_attention"] * 4),
      "not a qwen3_moe layer type",
    ),
  ],
)
def test_misfits_are_refused_naming_the_key(change, message):
  with pytest.raises(ConfigError, match=message):
    from_hf_dict(BASE | change, source="x/config.json")


@pytest.mark.parametrize(
  "d",
  [BASE, BASE | dict(decoder_sparse_step=2, mlp_only_layers=[3]), BASE | dict(num_experts=0)],
)
def test_a_written_config_reads_back_as_the_same_config(d):
  from specdec.models.config import to_hf_dict

  c = from_hf_dict(d)
  assert from_hf_dict(to_hf_dict(c)) == c
  moe = from_hf_dict(BASE | dict(model_type="qwen3_moe", layer_types=None, head_dim=8))
  assert moe.rotary_dim == 8 and "layer_types" not in to_hf_dict(moe)
  assert from_hf_dict(to_hf_dict(moe)) == moe


def test_writing_a_qwen3_5_config_is_refused():
  from specdec.models.config import to_hf_dict

  with pytest.raises(ValueError, match="qwen3_5_text config is not supported"):
    to_hf_dict(tiny_hybrid_config(model_type="qwen3_5_text"))
