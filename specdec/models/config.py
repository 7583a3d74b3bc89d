"""HF `config.json` -> a frozen dataclass for the decoder stack."""

import dataclasses
import json
import os
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen3", "llama")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class ConfigError(ValueError):
  """A config.json that cannot describe a model we run."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  model_type: str
  vocab_size: int  # V
  hidden_size: int  # D
  intermediate_size: int  # F
  num_layers: int  # L
  num_heads: int  # N
  num_kv_heads: int  # K
  head_dim: int  # H
  rms_norm_eps: float
  rope_theta: float
  max_position_embeddings: int
  tie_word_embeddings: bool
  qk_norm: bool  # Qwen3: per-head RMSNorm on q and k before RoPE
  attention_bias: bool
  mlp_bias: bool
  # Hashable view of HF's rope_scaling dict: (("factor", 8.0), ("rope_type", "llama3"), ...).
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()

  @property
  def num_groups(self) -> int:  # G: query heads per kv head
    return self.num_heads // self.num_kv_heads

  @property
  def rope_scaling_dict(self) -> dict[str, Any]:
    return dict(self.rope_scaling or ())

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)


def _eos_tuple(value) -> tuple[int, ...]:
  if value is None:
    return ()
  if isinstance(value, int):
    return (value,)
  return tuple(int(v) for v in value)


def from_hf_dict(d: dict[str, Any], source: str = "config.json") -> ModelConfig:
  """Maps an HF config dict; every problem names `source` and the key."""
  model_type = d.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ConfigError(
      f"{source}: unknown model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
    )

  def need(key):
    if key not in d or d[key] is None:
      raise ConfigError(f"{source}: missing config key {key!r} (model_type {model_type})")
    return d[key]

  hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
  kv_heads = int(d.get("num_key_value_heads") or heads)
  if heads % kv_heads:
    raise ConfigError(
      f"{source}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}"
    )
  head_dim = int(d.get("head_dim") or hidden // heads)
  # transformers 5 moved rope_theta/rope_scaling into one `rope_parameters` dict.
  rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type not in SUPPORTED_ROPE_TYPES:
    raise ConfigError(f"{source}: unsupported rope_type {rope_type!r} in rope scaling")
  theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
  rope.pop("rope_theta", None)
  rope.pop("type", None)
  rope["rope_type"] = rope_type
  scaling = None if rope_type == "default" else tuple(sorted(rope.items()))
  is_qwen3 = model_type == "qwen3"
  return ModelConfig(
    model_type=model_type,
    vocab_size=int(need("vocab_size")),
    hidden_size=hidden,
    intermediate_size=int(need("intermediate_size")),
    num_layers=int(need("num_hidden_layers")),
    num_heads=heads,
    num_kv_heads=kv_heads,
    head_dim=head_dim,
    rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
    rope_theta=float(theta),
    max_position_embeddings=int(need("max_position_embeddings")),
    tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
    qk_norm=is_qwen3,
    attention_bias=bool(d.get("attention_bias", False)),
    mlp_bias=bool(d.get("mlp_bias", False)),
    rope_scaling=scaling,
    bos_token_id=d.get("bos_token_id"),
    eos_token_ids=_eos_tuple(d.get("eos_token_id")),
  )


def to_hf_dict(c: ModelConfig) -> dict[str, Any]:
  """The inverse mapping, for checkpoints we write (the zoo)."""
  arch = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[c.model_type]
  d = {
    "architectures": [arch],
    "model_type": c.model_type,
    "vocab_size": c.vocab_size,
    "hidden_size": c.hidden_size,
    "intermediate_size": c.intermediate_size,
    "num_hidden_layers": c.num_layers,
    "num_attention_heads": c.num_heads,
    "num_key_value_heads": c.num_kv_heads,
    "head_dim": c.head_dim,
    "rms_norm_eps": c.rms_norm_eps,
    "rope_theta": c.rope_theta,
    "rope_scaling": c.rope_scaling_dict or None,
    "max_position_embeddings": c.max_position_embeddings,
    "tie_word_embeddings": c.tie_word_embeddings,
    "attention_bias": c.attention_bias,
    "hidden_act": "silu",
    "bos_token_id": c.bos_token_id,
    "eos_token_id": list(c.eos_token_ids) if c.eos_token_ids else None,
  }
  if c.model_type == "llama":
    d["mlp_bias"] = c.mlp_bias
  return d


def read_config_json(path: str) -> tuple[dict, str]:
  """(the dict in path/config.json, its file name); a missing or invalid file is a ConfigError."""
  file = os.path.join(path, "config.json")
  if not os.path.exists(file):
    raise ConfigError(f"{file}: not found")
  try:
    with open(file) as f:
      return json.load(f), file
  except json.JSONDecodeError as e:
    raise ConfigError(f"{file}: not valid JSON ({e})") from e


def load_config(path: str) -> ModelConfig:
  d, file = read_config_json(path)
  if d.get("hidden_act", "silu") not in ("silu", "swish"):
    raise ConfigError(f"{file}: unsupported hidden_act {d['hidden_act']!r} (SwiGLU needs silu)")
  return from_hf_dict(d, source=file)
