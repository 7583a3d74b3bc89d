"""The target's own multi-token-prediction head as the drafter (Qwen3-Next / Qwen3.5, DeepSeek-V3).

  out = layer(fc(cat[norm_e(emb(t_{i+1})), norm_h(h_i)])),   logits = lm_head(norm(out))

Embedding and LM head are the target's (its arrays, not copies). The concat order is [embedding,
hidden]: swapped, acceptance drops to ~0. h_i is the target's final-norm hidden for Qwen3.5 and
the last decoder layer's output for DeepSeek (a flag); the head chains the same kind of state it
was fed: Qwen returns the post-`mtp.norm` hidden (vLLM qwen3_next_mtp.py), DeepSeek the pre-norm
residual stream (deepseek_mtp.py). See `heads.py` for pairing, caching and rollback.

Checkpoint layouts (one MTP layer; the decoder layer uses the target family's tensor names):
  qwen3_next   mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.layers.0.*,
               mtp.norm; norm weights stored zero-centred (its RMSNorm computes x * (1 + w)).
               Over a hybrid target the layer is the family's own (`qwen3_next_mtp.py`): gated
               attention, routed experts where the target's rule puts them at layer 0
  deepseek_v3  model.layers.{L}.{eh_proj, enorm, hnorm, shared_head.norm, <decoder layer>}, L the
               target's layer count; its embed_tokens / shared_head.head copies are not read
  speculators  mtp_layers.0.{input_proj, token_layernorm, hidden_layernorm, final_layernorm,
               <decoder layer>} (vLLM's speculators format, `speculators_model_type` "mtp"): fed
               the target's last decoder layer output (aux id L, before the final norm), its
               output normed by final_layernorm feeds lm_head and the next depth
"""

import dataclasses
import functools
import json
import os
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec.checkpoint import hybrid_names
from specdec.checkpoint import names as target_names
from specdec.checkpoint.safetensors_io import CheckpointError, checkpoint_files
from specdec.drafters import heads, qwen3_next_mtp, speculators
from specdec.models import stack
from specdec.models.config import (
  ConfigError,
  HybridConfig,
  ModelConfig,
  language_model_dict,
  to_hf_dict,
)
from specdec.models.hybrid import HybridBlock
from specdec.models.hybrid_layers import ZeroCentredRMSNorm
from specdec.models.transformer import Block, KVCache, Linear, RMSNorm, Transformer

LAYOUTS = ("qwen3_next", "deepseek_v3", "speculators")
# Our module names -> the published ones, per layout (the decoder layer goes through the target's
# name table).
_RENAMES = {
  "qwen3_next": {},
  "deepseek_v3": {
    "fc": "eh_proj",
    "pre_fc_norm_embedding": "enorm",
    "pre_fc_norm_hidden": "hnorm",
    "norm": "shared_head.norm",
  },
  "speculators": {
    "fc": "input_proj",
    "pre_fc_norm_embedding": "token_layernorm",
    "pre_fc_norm_hidden": "hidden_layernorm",
    "norm": "final_layernorm",
  },
}
_PREFIX = {"qwen3_next": "mtp.", "speculators": "mtp_layers.0."}
_LAYER_PREFIX = {"qwen3_next": "mtp.layers.0.", "speculators": "mtp_layers.0."}


@dataclasses.dataclass(frozen=True)
class MTPConfig:
  layout: str = "qwen3_next"
  post_norm_hidden: bool = True  # feed the target's final-norm hidden (Qwen3.5) or pre-norm
  mask_first_embedding: bool = False  # DeepSeek zeroes the embedding of the pair at position 0
  last_layer_feature: bool = False  # fed the last decoder layer's output even if post-norm

  @staticmethod
  def deepseek_v3() -> "MTPConfig":
    return MTPConfig(layout="deepseek_v3", post_norm_hidden=False, mask_first_embedding=True)

  @staticmethod
  def speculators() -> "MTPConfig":
    return MTPConfig(layout="speculators", last_layer_feature=True)

  @property
  def feeds_last_layer(self) -> bool:
    return self.last_layer_feature or not self.post_norm_hidden

  def check(self) -> "MTPConfig":
    if self.layout not in LAYOUTS:
      raise ValueError(f"mtp: unknown layout {self.layout!r}; choose one of {', '.join(LAYOUTS)}")
    return self


class MTPHead(nn.Module):
  config: ModelConfig  # the target's: the MTP layer is one of its decoder layers
  mask_first_embedding: bool = False

  def setup(self):
    c = self.config
    hybrid = isinstance(c, HybridConfig)
    norm = ZeroCentredRMSNorm if hybrid and c.norm_plus_one else RMSNorm
    self.pre_fc_norm_embedding = norm(c.rms_norm_eps)
    self.pre_fc_norm_hidden = norm(c.rms_norm_eps)
    self.fc = Linear(c.hidden_size)
    self.layer_0 = HybridBlock(qwen3_next_mtp.layer_config(c), 0) if hybrid else Block(c)
    self.norm = norm(c.rms_norm_eps)

  def __call__(self, emb_BTD, h_BTD, positions_BT, cache: KVCache, tree=None):
    """-> (pre-norm output, post-norm output, cache); tree: a `TreeMask` (not over a hybrid
    target, whose trees the step refuses)."""
    if self.mask_first_embedding:
      emb_BTD = jnp.where((positions_BT == 0)[..., None], 0, emb_BTD)
    e_BTD = self.pre_fc_norm_embedding(emb_BTD)
    h_BTD = self.pre_fc_norm_hidden(h_BTD.astype(emb_BTD.dtype))
    x_BTD = self.fc(jnp.concatenate([e_BTD, h_BTD], -1))
    kv = (cache.k[0], cache.v[0])
    if isinstance(self.config, HybridConfig):
      x_BTD, (k_BSKH, v_BSKH) = self.layer_0(x_BTD, positions_BT, kv, None)
    else:
      x_BTD, k_BSKH, v_BSKH = self.layer_0(x_BTD, positions_BT, *kv, tree)
    return x_BTD, self.norm(x_BTD), KVCache(k=(k_BSKH,), v=(v_BSKH,))

  def final_norm(self, x_BTD):
    return self.norm(x_BTD)


@dataclasses.dataclass(frozen=True)
class MTP(heads.ChainedHead):
  name = "mtp"
  spec: MTPConfig = MTPConfig()
  # weights: {"head": MTPHead variables, "target": {"params": {embed[, lm_head]}}}
  weights: Any = heads.weights_field()

  @staticmethod
  def build(config: ModelConfig, dtype, spec: MTPConfig, weights=None) -> "MTP":
    """The drafter for a target of this config; weights may be None where params come as
    arguments (training)."""
    return MTP(
      taps=(config.num_layers - 1,) if spec.check().feeds_last_layer else (),
      head_config=config,
      dtype=dtype,
      spec=spec,
      weights=weights,
    )

  @property
  def params(self):
    return self.weights

  @property
  def module(self) -> MTPHead:
    return MTPHead(self.head_config, self.spec.mask_first_embedding)

  @property
  def target_module(self) -> Transformer:
    return stack.decoder(self.head_config, self.dtype)

  def validate(self, target_config, k, slots):
    mine, theirs = self.head_config, target_config
    for key in ("hidden_size", "vocab_size", "num_layers"):
      if getattr(mine, key) != getattr(theirs, key):
        raise ValueError(
          f"mtp: built for a target with {key}={getattr(mine, key)}, this target has "
          f"{getattr(theirs, key)}"
        )

  def features(self, params, target):
    return target.taps[-1] if self.spec.feeds_last_layer else target.hidden

  def forward(self, params, h_BTD, tokens_BT, positions_BT, cache, tree=None):
    emb_BTD = self.target_module.apply(params["target"], tokens_BT, method="embed_tokens")
    raw_BTD, normed_BTD, cache = self.module.apply(
      params["head"], emb_BTD, h_BTD, positions_BT, cache, tree
    )
    return (normed_BTD if self.spec.post_norm_hidden else raw_BTD), cache

  def logits(self, params, out_BD):
    if not self.spec.post_norm_hidden:
      out_BD = self.module.apply(params["head"], out_BD, method="final_norm")
    return self.target_module.apply(params["target"], out_BD, method="head")


def shared_target_params(target_params) -> dict:
  """The target's embedding and LM head, by reference: the drafter holds no copy."""
  p = target_params["params"]
  return {"params": {k: p[k] for k in ("embed", "lm_head") if k in p}}


# Jitted: eager initialisation compiles one random-normal per parameter shape.
@functools.partial(jax.jit, static_argnames=("config", "spec", "dtype"))
def init_head(config: ModelConfig, spec: MTPConfig, key, dtype=jnp.float32) -> dict:
  tok = jnp.zeros((1, 1), jnp.int32)
  x = jnp.zeros((1, 1, config.hidden_size), dtype)
  cache = KVCache.zeros(config.replace(num_layers=1), 1, 1, dtype)
  params = MTPHead(config, spec.mask_first_embedding).init(key, x, x, tok, cache)
  return jax.tree.map(lambda p: p.astype(dtype), params)


def mtp(target, params=None, *, config: MTPConfig = MTPConfig(), seed: int = 0) -> MTP:
  """An MTP drafter for `target` (a specdec.Model). params: the head's variables (trained, or
  from `load_mtp`); None initialises a random head (an untrained head: for tests)."""
  if params is None:
    params = init_head(target.config, config, jax.random.key(seed), target.dtype)
  params = jax.tree.map(lambda p: jnp.asarray(p, target.dtype), params)
  weights = {"head": params, "target": shared_target_params(target.params)}
  return MTP.build(target.config, target.dtype, config, weights)


# --- Checkpoint layout ------------------------------------------------------------------------


def tensor_names(config: ModelConfig, layout: str) -> dict[str, tuple[str, bool]]:
  """params path -> (published tensor name, transpose) for every tensor of the head."""
  shapes = _shapes(config)
  prefix = _PREFIX.get(layout, f"model.layers.{config.num_layers}.")
  layer_prefix = _LAYER_PREFIX.get(layout, prefix)
  hybrid = isinstance(config, HybridConfig)
  out = {}
  for path in shapes:
    if qwen3_next_mtp.is_stacked(path):
      continue  # one tensor per expert: `qwen3_next_mtp.read_experts`
    if path.startswith("layer_0/"):
      name, transpose = (hybrid_names.to_hf_name if hybrid else target_names.to_hf_name)(path)
      out[path] = (layer_prefix + name.removeprefix("model.layers.0."), transpose)
    else:
      name, transpose = heads.hf_style_name(path)
      module, leaf = name.rsplit(".", 1)
      out[path] = (prefix + _RENAMES[layout].get(module, module) + "." + leaf, transpose)
  return out


def _shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
  tok = jnp.zeros((1, 1), jnp.int32)
  x = jnp.zeros((1, 1, config.hidden_size), jnp.float32)
  cache = KVCache.zeros(config.replace(num_layers=1), 1, 1, jnp.float32)
  return heads.param_shapes(MTPHead(config), x, x, tok, cache)


def _owned(config: ModelConfig, layout: str):
  if layout in _PREFIX:
    return lambda name: name.startswith(_PREFIX[layout].split(".")[0] + ".")
  pattern = re.compile(r"model\.layers\.(\d+)\.")

  def owned(name):
    m = pattern.match(name)
    return m is not None and int(m.group(1)) >= config.num_layers

  return owned


def _read_config(path: str) -> tuple[dict, str]:
  """(path/config.json, its name); a vision-language wrapper's (Qwen3.5 as published): the
  language model's, which holds the MTP fields."""
  file = os.path.join(path, "config.json")
  if not os.path.exists(file):
    return {}, file
  with open(file) as f:
    d = json.load(f)
  try:
    return language_model_dict(d, file), file
  except ConfigError as e:
    raise CheckpointError(str(e)) from e


def _num_mtp_layers(d: dict) -> int | None:
  n = d.get("num_nextn_predict_layers", d.get("mtp_num_hidden_layers"))
  return None if n is None else int(n)


def _check_speculators(d: dict, file: str, target_config: ModelConfig) -> None:
  """A speculators MTP config against the target: its layer is one of the target's layers."""
  try:
    kind = speculators.model_type(d, file)
    tl = speculators.layer_dict(d, file)
  except ValueError as e:
    raise CheckpointError(str(e)) from e
  if kind != "mtp":
    raise CheckpointError(f"{file}: speculators_model_type {kind!r} is not an MTP head")
  mine = target_config.model_type
  if tl.get("model_type", mine) != mine:
    raise CheckpointError(
      f"{file}: transformer_layer_config.model_type {tl['model_type']!r} differs from the "
      f"target's {mine!r} (the MTP layer is one of the target's decoder layers)"
    )
  for key, ours in (("hidden_size", "hidden_size"), ("vocab_size", "vocab_size")):
    if key in tl and int(tl[key]) != getattr(target_config, ours):
      raise CheckpointError(
        f"{file}: transformer_layer_config.{key} {tl[key]} differs from the target's "
        f"{getattr(target_config, ours)}"
      )


def _norms_stored_zero_centred(layout: str, config: ModelConfig) -> bool:
  """Whether the stored norm weights are w of x * (1 + w) while our module computes x * w."""
  return layout == "qwen3_next" and not getattr(config, "norm_plus_one", False)


def detect_layout(path: str, target_config: ModelConfig) -> MTPConfig:
  """The layout's default config from the tensor names in a checkpoint directory."""
  files = checkpoint_files(path)
  if any(name.startswith("mtp_layers.") for name in files):
    return MTPConfig.speculators()
  if any(name.startswith("mtp.") for name in files):
    return MTPConfig()
  if f"model.layers.{target_config.num_layers}.eh_proj.weight" in files:
    return MTPConfig.deepseek_v3()
  raise CheckpointError(
    f"{path}: no MTP head: neither 'mtp.*' tensors nor "
    f"'model.layers.{target_config.num_layers}.eh_proj.weight'"
  )


def load_mtp(path: str, target, config: MTPConfig | None = None) -> MTP:
  """Reads the MTP head from a checkpoint directory (the target's own, or one `save_mtp` wrote).
  config: default by the layout found (Qwen3-Next post-norm, DeepSeek-V3 pre-norm)."""
  c = target.config
  config = (config or detect_layout(path, c)).check()
  d, file = _read_config(path)
  if config.layout == "speculators":
    _check_speculators(d, file, c)
  n = _num_mtp_layers(d)
  if n is not None and n != 1:
    raise CheckpointError(
      f"{file}: {n} MTP layers; only checkpoints with one MTP layer are supported"
    )
  if d.get("mtp_use_dedicated_embeddings"):
    raise CheckpointError(
      f"{file}: mtp_use_dedicated_embeddings is true; only heads that share the target's "
      "embedding are supported"
    )
  extras = ()
  if isinstance(c, HybridConfig):
    if config.layout != "qwen3_next":
      raise CheckpointError(
        f"{path}: a {config.layout} MTP head over a {c.model_type} target; only the "
        "qwen3_next layout (mtp.*) is supported for hybrid targets"
      )
    extras = qwen3_next_mtp.expert_names(c)
  elif config.layout == "deepseek_v3":  # DeepSeek stores copies of the shared tensors per layer
    prefix = f"model.layers.{c.num_layers}."
    extras = (prefix + "embed_tokens.weight", prefix + "shared_head.head.weight")
  shapes = _shapes(c)
  flat, found = heads.read_head(
    path, tensor_names(c, config.layout), shapes, _owned(c, config.layout), extras
  )
  if isinstance(c, HybridConfig):
    flat.update(qwen3_next_mtp.read_experts(path, found, c, shapes))
  if _norms_stored_zero_centred(config.layout, c):
    flat = {p: v + 1.0 if p.endswith("/scale") else v for p, v in flat.items()}
  return mtp(target, heads.as_params(flat, target.dtype), config=config)


def save_mtp(path: str, drafter: MTP, dtype=None) -> None:
  """Writes the head in its published layout (model.safetensors) with a config.json that records
  the target's config and one MTP layer; `load_mtp(path, target)` reads it back. A hybrid
  target's head (qwen3_next layout) writes its routed experts one tensor each, as the family
  ships them."""
  layout = drafter.spec.layout
  if isinstance(drafter.head_config, HybridConfig) and layout != "qwen3_next":
    raise ValueError(
      f"save_mtp: a {drafter.head_config.model_type} target's head is written in the qwen3_next "
      f"layout only, not {layout}"
    )
  os.makedirs(path, exist_ok=True)
  flat = heads.flat_params(drafter.weights["head"])
  if _norms_stored_zero_centred(layout, drafter.head_config):
    flat = {p: v - 1.0 if p.endswith("/scale") else v for p, v in flat.items()}
  experts = {}
  for p in [p for p in flat if qwen3_next_mtp.is_stacked(p)]:
    a = np.asarray(jnp.asarray(flat.pop(p), dtype))
    experts |= hybrid_names.unstack_experts(p, a, prefix=_PREFIX["qwen3_next"])
  names = tensor_names(drafter.head_config, layout)
  heads.write_head(os.path.join(path, "model.safetensors"), flat, names, experts, dtype=dtype)
  if layout == "speculators":
    d = speculators.mtp_dict(drafter.head_config)
  else:
    d = to_hf_dict(drafter.head_config)
    d.update(num_nextn_predict_layers=1, mtp_num_hidden_layers=1)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(d, f, indent=2)
