"""HF `config.json` -> a frozen dataclass for the decoder stack."""

import dataclasses
import json
import os
from typing import Any

# HybridConfig: GDN and/or routed experts. Qwen3.5's text models (what Qwen3_5ForCausalLM writes)
# are Qwen3-Next layers with the GDN input projections split (hybrid_names.fuse_split_gdn).
QWEN3_5 = ("qwen3_5_text", "qwen3_5_moe_text")
NEXT_FAMILY = ("qwen3_next", *QWEN3_5)  # gated attention, zero-centred norms, GDN layers
HYBRID_MODEL_TYPES = (*NEXT_FAMILY, "qwen3_moe")
SUPPORTED_MODEL_TYPES = ("qwen3", "llama", *HYBRID_MODEL_TYPES)
# The vision-language wrappers Qwen publishes Qwen3.5 as (Qwen3_5ForConditionalGeneration): the
# language model's config nests under `text_config`; we load the language model alone.
VL_WRAPPERS = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
# What the wrapper keeps at its own level and transformers reads from there: the wrapper's lm_head
# ties by the wrapper's `tie_word_embeddings` (default false, whatever text_config says); token
# ids are read from the wrapper first, then from text_config (GenerationConfig.from_model_config).
_WRAPPER_TOKEN_IDS = ("bos_token_id", "eos_token_id")
LAYER_TYPES = ("full_attention", "linear_attention")
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


@dataclasses.dataclass(frozen=True)
class HybridConfig(ModelConfig):
  """Qwen3-Next and Qwen3.5 (Gated DeltaNet + gated attention, routed experts) and Qwen3-MoE
  (all attention).

  Per layer: its token mixer (`layer_types`) and whether its MLP is the routed-expert block
  (`moe_layers`). Linear-attention letters: Q q/k heads of head dim H, Y value heads of dim U,
  Z conv taps; I routed experts, e of them per token (docs/design.md, "Shape letters").
  """

  layer_types: tuple[str, ...] = ()
  moe_layers: tuple[bool, ...] = ()
  linear_num_key_heads: int = 0  # Q
  linear_num_value_heads: int = 0  # Y
  linear_key_head_dim: int = 0  # H of the linear layers
  linear_value_head_dim: int = 0  # U
  linear_conv_kernel: int = 4  # Z
  rotary_dim: int = 0  # RoPE rotates the first rotary_dim of each head (partial rotary)
  attn_output_gate: bool = False  # q_proj also yields a per-head sigmoid gate on the output
  norm_plus_one: bool = False  # RMSNorm weights are zero-centred: y = norm(x) * (1 + w)
  num_experts: int = 0  # I
  num_experts_per_tok: int = 0  # e
  moe_intermediate_size: int = 0
  shared_expert_intermediate_size: int = 0  # 0: no shared expert
  norm_topk_prob: bool = True

  @property
  def linear_layers(self) -> tuple[int, ...]:
    return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

  @property
  def attention_layers(self) -> tuple[int, ...]:
    return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

  @property
  def conv_dim(self) -> int:  # X: the q, k, v channels the short conv mixes
    return 2 * self.linear_num_key_heads * self.linear_key_head_dim + (
      self.linear_num_value_heads * self.linear_value_head_dim
    )


def _hybrid_fields(d: dict[str, Any], source: str, num_layers: int, head_dim: int) -> dict:
  """HybridConfig's own fields from an HF config; each misfit names `source` and the key."""
  model_type = d["model_type"]
  is_next = model_type in NEXT_FAMILY
  if is_next:
    interval = int(d.get("full_attention_interval", 4))
    default = [
      "linear_attention" if (i + 1) % interval else "full_attention" for i in range(num_layers)
    ]
  else:
    default = ["full_attention"] * num_layers
  layer_types = tuple(d.get("layer_types") or default)
  if len(layer_types) != num_layers:
    raise ConfigError(
      f"{source}: layer_types has {len(layer_types)} entries but num_hidden_layers={num_layers}"
    )
  for i, t in enumerate(layer_types):
    allowed = LAYER_TYPES if is_next else ("full_attention",)
    if t not in allowed:
      raise ConfigError(
        f"{source}: layer_types[{i}] = {t!r} is not a {model_type} layer type; "
        f"expected one of {', '.join(allowed)}"
      )
  fields = {}
  if "linear_attention" in layer_types:
    keys = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim")
    q_heads, v_heads, k_dim = (int(d.get(k) or 0) for k in keys)
    v_dim = int(d.get("linear_value_head_dim") or 0)
    conv = int(d.get("linear_conv_kernel_dim", 4))
    if min(q_heads, v_heads, k_dim, v_dim, conv) < 1:
      raise ConfigError(
        f"{source}: linear attention needs linear_num_key_heads, linear_num_value_heads, "
        f"linear_key_head_dim, linear_value_head_dim and linear_conv_kernel_dim >= 1; got "
        f"{q_heads}, {v_heads}, {k_dim}, {v_dim}, {conv}"
      )
    if v_heads % q_heads:
      raise ConfigError(
        f"{source}: linear_num_value_heads={v_heads} is not a multiple of "
        f"linear_num_key_heads={q_heads} (each key head serves a whole group of value heads)"
      )
    fields.update(
      linear_num_key_heads=q_heads,
      linear_num_value_heads=v_heads,
      linear_key_head_dim=k_dim,
      linear_value_head_dim=v_dim,
      linear_conv_kernel=conv,
    )
  n_experts = int(
    d.get("num_experts") or d.get("num_local_experts") or 0
  )  # transformers 5 writes the latter
  if model_type == "qwen3_5_moe_text" and n_experts < 1:
    raise ConfigError(f"{source}: qwen3_5_moe_text needs num_experts >= 1 (every layer is routed)")
  step = int(d.get("decoder_sparse_step") or 1)
  dense_only = set(d.get("mlp_only_layers") or ())
  moe = tuple(
    n_experts > 0 and i not in dense_only and (i + 1) % step == 0 for i in range(num_layers)
  )
  if any(moe):
    top = int(d.get("num_experts_per_tok") or 0)
    if not 1 <= top <= n_experts:
      raise ConfigError(
        f"{source}: num_experts_per_tok={top} must be in [1, num_experts={n_experts}]"
      )
    if int(d.get("moe_intermediate_size") or 0) < 1:
      raise ConfigError(f"{source}: missing config key 'moe_intermediate_size' (num_experts > 0)")
    fields.update(
      num_experts=n_experts,
      num_experts_per_tok=top,
      moe_intermediate_size=int(d["moe_intermediate_size"]),
      shared_expert_intermediate_size=int(d.get("shared_expert_intermediate_size") or 0),
      # Qwen3.5-MoE's router always renormalizes (its config has no norm_topk_prob).
      norm_topk_prob=bool(d.get("norm_topk_prob", is_next)),
    )
  rope = d.get("rope_parameters") or {}
  factor = float(rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)))
  if is_next and "partial_rotary_factor" not in rope | d:
    factor = 0.25  # transformers' default for the family
  rotary = int(head_dim * factor)
  if rotary < 2 or rotary % 2 or rotary > head_dim:
    raise ConfigError(
      f"{source}: partial_rotary_factor={factor} gives rotary dim {rotary} of head_dim "
      f"{head_dim}; it must be even and in [2, head_dim]"
    )
  return dict(
    fields,
    layer_types=layer_types,
    moe_layers=moe,
    rotary_dim=rotary,
    attn_output_gate=is_next,
    norm_plus_one=is_next,
  )


def _eos_tuple(value) -> tuple[int, ...]:
  if value is None:
    return ()
  if isinstance(value, int):
    return (value,)
  return tuple(int(v) for v in value)


def language_model_dict(d: dict[str, Any], source: str = "config.json") -> dict[str, Any]:
  """The language model's config of a vision-language wrapper (`VL_WRAPPERS`): its `text_config`
  with the fields the wrapper keeps at its own level; any other dict as it is."""
  wrapper = d.get("model_type")
  if wrapper not in VL_WRAPPERS:
    return d
  text = d.get("text_config")
  if not isinstance(text, dict):
    raise ConfigError(
      f"{source}: missing config key 'text_config' (model_type {wrapper} nests the language "
      "model's config there)"
    )
  want = VL_WRAPPERS[wrapper]
  if text.get("model_type", want) != want:
    raise ConfigError(
      f"{source}: text_config.model_type {text['model_type']!r} is not {want!r} "
      f"(model_type {wrapper})"
    )
  out = dict(text, model_type=want, tie_word_embeddings=bool(d.get("tie_word_embeddings", False)))
  for key in _WRAPPER_TOKEN_IDS:
    if d.get(key) is not None:
      out[key] = d[key]
  return out


def from_hf_dict(d: dict[str, Any], source: str = "config.json") -> ModelConfig:
  """Maps an HF config dict (a vision-language wrapper's: its language model); every problem
  names `source` and the key."""
  if d.get("model_type") in VL_WRAPPERS:
    d, source = language_model_dict(d, source), f"{source} text_config"
  model_type = d.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    known = (*SUPPORTED_MODEL_TYPES, *VL_WRAPPERS)
    raise ConfigError(f"{source}: unknown model_type {model_type!r}; supported: {', '.join(known)}")

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
  rope.pop("partial_rotary_factor", None)  # HybridConfig.rotary_dim
  rope["rope_type"] = rope_type
  scaling = None if rope_type == "default" else tuple(sorted(rope.items()))
  hybrid = {}
  if model_type in HYBRID_MODEL_TYPES:
    hybrid = _hybrid_fields(d, source, int(need("num_hidden_layers")), head_dim)
  return (HybridConfig if hybrid else ModelConfig)(
    **hybrid,
    model_type=model_type,
    vocab_size=int(need("vocab_size")),
    hidden_size=hidden,
    # Qwen3.5-MoE has no dense MLP, hence no intermediate_size.
    intermediate_size=int(d.get("intermediate_size") or 0)
    if model_type == "qwen3_5_moe_text"
    else int(need("intermediate_size")),
    num_layers=int(need("num_hidden_layers")),
    num_heads=heads,
    num_kv_heads=kv_heads,
    head_dim=head_dim,
    rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
    rope_theta=float(theta),
    max_position_embeddings=int(need("max_position_embeddings")),
    tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
    qk_norm=model_type != "llama",
    attention_bias=bool(d.get("attention_bias", False)),
    mlp_bias=bool(d.get("mlp_bias", False)),
    rope_scaling=scaling,
    bos_token_id=d.get("bos_token_id"),
    eos_token_ids=_eos_tuple(d.get("eos_token_id")),
  )


# The model types a checkpoint is written for (the zoo), by their HF architecture. Qwen3.5's text
# models would need their split GDN projections written back (hybrid_names.fuse_split_gdn).
ARCHITECTURES = {
  "qwen3": "Qwen3ForCausalLM",
  "llama": "LlamaForCausalLM",
  "qwen3_next": "Qwen3NextForCausalLM",
  "qwen3_moe": "Qwen3MoeForCausalLM",
}


def to_hf_dict(c: ModelConfig) -> dict[str, Any]:
  """The inverse mapping, for checkpoints we write (the zoo)."""
  if c.model_type not in ARCHITECTURES:
    raise ValueError(
      f"writing a {c.model_type} config is not supported (only loading is); writable: "
      f"{', '.join(ARCHITECTURES)}"
    )
  d = {
    "architectures": [ARCHITECTURES[c.model_type]],
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
  if isinstance(c, HybridConfig):
    d.update(_hybrid_hf_fields(c))
  return d


def _hybrid_hf_fields(c: HybridConfig) -> dict[str, Any]:
  """The keys `_hybrid_fields` reads back to `c`: the layer schedule, GDN dims, partial RoPE and
  the routed experts (where layers without them are `mlp_only_layers`)."""
  d: dict[str, Any] = {"num_experts": c.num_experts}
  if c.model_type in NEXT_FAMILY:
    d["layer_types"] = list(c.layer_types)
    d["partial_rotary_factor"] = c.rotary_dim / c.head_dim
  if c.linear_layers:
    d.update(
      linear_num_key_heads=c.linear_num_key_heads,
      linear_num_value_heads=c.linear_num_value_heads,
      linear_key_head_dim=c.linear_key_head_dim,
      linear_value_head_dim=c.linear_value_head_dim,
      linear_conv_kernel_dim=c.linear_conv_kernel,
    )
  if c.num_experts:
    d.update(
      num_experts_per_tok=c.num_experts_per_tok,
      moe_intermediate_size=c.moe_intermediate_size,
      shared_expert_intermediate_size=c.shared_expert_intermediate_size,
      norm_topk_prob=c.norm_topk_prob,
      decoder_sparse_step=1,
      mlp_only_layers=[i for i, routed in enumerate(c.moe_layers) if not routed],
    )
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
  act = language_model_dict(d, file).get("hidden_act", "silu")
  if act not in ("silu", "swish"):
    raise ConfigError(f"{file}: unsupported hidden_act {act!r} (SwiGLU needs silu)")
  return from_hf_dict(d, source=file)
