"""EAGLE-3 as the drafter: three target taps fused by fc, one decoder layer, a reduced vocabulary.

  g_i = fc(cat[low_i, mid_i, high_i])                       (3 Dt -> D, target features only)
  out = midlayer(emb(t_{i+1}), g_i):  q/k/v read cat[input_layernorm(emb), hidden_norm(g)] (2D
        wide), the residual stream starts from g (from hidden_norm(g) with norm_before_residual)
  logits over the draft vocabulary = lm_head(norm(out)); draft id d is target id d + d2t[d]

Deeper drafts feed `out` back in place of g, without fc (EAGLE's cnets.py, vLLM llama_eagle3.py).
Taps: EAGLE-3 records the INPUT of target layers (2, L//2, L-3), i.e. HF hidden_states[i];
our tap j is the output of decoder layer j, so aux id i is tap i - 1. SGLang's `eagle_config`
ids count layer OUTPUTS instead (it captures the input of layer id + 1), so there id i is tap i.
See `heads.py` for pairing, caching and rollback.

speculators' options: norm_before_fc (one RMSNorm `input_norm` over the concatenated 3 Dt taps
before fc), fc_norm (an RMSNorm per tap, `fc_norm.{j}`), norm_output (the head's output is normed
once by `norm`; that normed state feeds both lm_head and the next depth); a qwen3 layer adds q/k
norms.

Published layout (safetensors + config.json, `LlamaForCausalLMEagle3`): fc.weight [D, 3 Dt],
midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}.weight,
midlayer.self_attn.{q,k,v}_proj.weight [., 2D], midlayer.self_attn.o_proj.weight,
midlayer.mlp.{gate,up,down}_proj.weight, norm.weight, lm_head.weight [Vd, D], d2t int [Vd]
(offsets), t2d bool [V], optional embed_tokens.weight [V, D] (else the target's embedding).
config.json: draft_vocab_size, target_hidden_size, eagle_aux_hidden_state_layer_ids (top level,
vLLM's ids, or under eagle_config, SGLang's), norm_before_residual. Some exports name the layer
layers.0.* instead of midlayer.*; both load. The speculators layout (`speculators_model_type`
"eagle3", see `speculators.py`) names it layers.0.* and adds input_norm / fc_norm.
"""

import dataclasses
import functools
import json
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec.checkpoint.safetensors_io import CheckpointError, checkpoint_files
from specdec.drafters import heads, speculators
from specdec.drafters.vocab import draft_ids_from_tensors, vocab_tensors
from specdec.models import config as model_config
from specdec.models.config import ModelConfig
from specdec.models.transformer import MLP, Attention, KVCache, Linear, RMSNorm

ARCH = "LlamaForCausalLMEagle3"
NUM_TAPS = 3


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
  """EAGLE-3's low/mid/high features: the inputs of layers 2, L//2 and L-3. On a target too
  shallow for three distinct ones (L < 8; vLLM and speculators refuse repeats) an id that repeats
  or falls below 1 moves up to the next free layer, at most L (the last layer's output)."""
  ids = []
  for i in sorted((2, num_layers // 2, num_layers - 3)):
    ids.append(min(max(i, 1, ids[-1] + 1 if ids else 1), num_layers))
  return tuple(ids)


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
  head: ModelConfig  # the draft layer (llama layout); vocab_size is the target's
  draft_vocab_size: int  # Vd
  aux_layer_ids: tuple[int, ...]  # HF hidden_states indices: the inputs of these target layers
  target_hidden_size: int  # Dt
  norm_before_residual: bool = False
  norm_before_fc: bool = False  # one RMSNorm over the 3 Dt concatenated taps
  fc_norm: bool = False  # an RMSNorm per tap
  norm_output: bool = False  # the normed output feeds lm_head and the next depth

  @property
  def taps(self) -> tuple[int, ...]:
    return tuple(i - 1 for i in self.aux_layer_ids)

  def check(self, target: ModelConfig, source: str = "eagle3") -> "Eagle3Config":
    """Raises ValueError naming what does not fit the target."""
    if len(self.aux_layer_ids) != NUM_TAPS:
      raise ValueError(
        f"{source}: eagle_aux_hidden_state_layer_ids has {len(self.aux_layer_ids)} entries; "
        f"EAGLE-3 fuses exactly {NUM_TAPS} (fc.weight reads {NUM_TAPS} x target_hidden_size)"
      )
    if self.norm_before_fc and self.fc_norm:
      raise ValueError(f"{source}: norm_before_fc and fc_norm are mutually exclusive")
    # 0, the embedding output, is not a tap; L is the last layer's output.
    speculators.check_layer_ids(
      self.aux_layer_ids,
      "eagle_aux_hidden_state_layer_ids",
      source,
      low=1,
      high=target.num_layers,
    )
    if self.target_hidden_size != target.hidden_size:
      raise ValueError(
        f"{source}: target_hidden_size {self.target_hidden_size} does not match the target's "
        f"hidden_size {target.hidden_size} (fc.weight reads {NUM_TAPS} x target_hidden_size)"
      )
    if self.head.vocab_size != target.vocab_size:
      raise ValueError(
        f"{source}: vocab_size {self.head.vocab_size} differs from the target's {target.vocab_size}"
      )
    if not 1 <= self.draft_vocab_size <= target.vocab_size:
      raise ValueError(f"{source}: draft_vocab_size {self.draft_vocab_size} not in [1, V]")
    return self


def make_config(
  target: ModelConfig,
  *,
  draft_vocab_size: int | None = None,
  aux_layer_ids: tuple[int, ...] | None = None,
  intermediate_size: int | None = None,
  norm_before_residual: bool = False,
  qk_norm: bool = False,
  **options,
) -> Eagle3Config:
  """A new head for `target`: the target's width, heads and RoPE; a llama layer (qk_norm: a
  qwen3 one), a plain ModelConfig even over a hybrid target (whose layer schedule, recurrent and
  expert fields describe the target, not the head). options: norm_before_fc, fc_norm,
  norm_output."""
  dense = {f.name: getattr(target, f.name) for f in dataclasses.fields(model_config.ModelConfig)}
  head = model_config.ModelConfig(**dense).replace(
    model_type="qwen3" if qk_norm else "llama",
    qk_norm=qk_norm,
    num_layers=1,
    intermediate_size=intermediate_size or target.intermediate_size,
  )
  return Eagle3Config(
    head=head,
    draft_vocab_size=draft_vocab_size or target.vocab_size,
    aux_layer_ids=tuple(aux_layer_ids or default_aux_layer_ids(target.num_layers)),
    target_hidden_size=target.hidden_size,
    norm_before_residual=norm_before_residual,
    **options,
  ).check(target)


def _legacy_aux_ids(d: dict, source: str) -> tuple[int, ...] | None:
  """Aux ids in vLLM's convention from a legacy config: top-level ids are vLLM's; SGLang's
  `eagle_config` ids count layer outputs (SGLang captures the input of layer id + 1)."""
  top = d.get("eagle_aux_hidden_state_layer_ids")
  nested = (d.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
  if nested is not None:
    key = "eagle_config.eagle_aux_hidden_state_layer_ids"
    speculators.check_layer_ids(nested, key, source, low=0, high=None)
    nested = tuple(int(i) + 1 for i in nested)
  if top is not None:
    top = tuple(int(i) for i in top)
    if nested is not None and nested != top:
      raise ValueError(
        f"{source}: eagle_aux_hidden_state_layer_ids {list(top)} (vLLM: inputs of layers) and "
        f"eagle_config.eagle_aux_hidden_state_layer_ids (SGLang: outputs of layers, i.e. inputs "
        f"{list(nested)}) disagree"
      )
  return top if top is not None else nested


def from_hf_dict(d: dict, target: ModelConfig, source: str = "config.json") -> Eagle3Config:
  if speculators.model_type(d, source) is not None:
    fields = speculators.eagle3_fields(d, source)
    ids = fields.pop("aux_layer_ids") or default_aux_layer_ids(target.num_layers)
    return Eagle3Config(aux_layer_ids=ids, **fields).check(target, source)
  if int(d.get("num_hidden_layers", 1)) != 1:
    raise ValueError(f"{source}: num_hidden_layers={d['num_hidden_layers']}; EAGLE-3 has one")
  for flag in ("norm_before_fc", "fc_norm", "norm_output"):
    if d.get(flag):
      raise ValueError(f"{source}: {flag}=true outside the speculators format is not supported")
  head = model_config.from_hf_dict({**d, "model_type": "llama"}, source=source)
  ids = _legacy_aux_ids(d, source)
  return Eagle3Config(
    head=head,
    draft_vocab_size=int(d.get("draft_vocab_size") or head.vocab_size),
    aux_layer_ids=ids or default_aux_layer_ids(target.num_layers),
    target_hidden_size=int(d.get("target_hidden_size") or head.hidden_size),
    norm_before_residual=bool(d.get("norm_before_residual", False)),
  ).check(target, source)


def to_hf_dict(cfg: Eagle3Config) -> dict:
  if cfg.norm_before_fc or cfg.fc_norm or cfg.norm_output or cfg.head.qk_norm:
    raise ValueError(
      "the legacy EAGLE-3 layout has no norm_before_fc / fc_norm / norm_output / qwen3 layer; "
      'save with format="speculators"'
    )
  d = model_config.to_hf_dict(cfg.head)
  d.update(
    architectures=[ARCH],
    num_hidden_layers=1,
    draft_vocab_size=cfg.draft_vocab_size,
    target_hidden_size=cfg.target_hidden_size,
    eagle_aux_hidden_state_layer_ids=list(cfg.aux_layer_ids),
    norm_before_residual=cfg.norm_before_residual,
  )
  return d


class Eagle3Layer(nn.Module):
  config: ModelConfig
  norm_before_residual: bool = False

  @nn.compact
  def __call__(self, emb_BTD, h_BTD, positions_BT, k_BSKH, v_BSKH, tree=None):
    c = self.config
    e_BTD = RMSNorm(c.rms_norm_eps, name="input_layernorm")(emb_BTD)
    hn_BTD = RMSNorm(c.rms_norm_eps, name="hidden_norm")(h_BTD)
    x_BTD = hn_BTD if self.norm_before_residual else h_BTD
    # q/k/v project the 2D-wide [embedding, hidden]; o_proj returns to D.
    a_BTD, k_BSKH, v_BSKH = Attention(c, name="self_attn")(
      jnp.concatenate([e_BTD, hn_BTD], -1), positions_BT, k_BSKH, v_BSKH, tree
    )
    x_BTD = x_BTD + a_BTD
    mlp_in_BTD = RMSNorm(c.rms_norm_eps, name="post_attention_layernorm")(x_BTD)
    return x_BTD + MLP(c, name="mlp")(mlp_in_BTD), k_BSKH, v_BSKH


class Eagle3Head(nn.Module):
  config: ModelConfig
  draft_vocab_size: int
  norm_before_residual: bool = False
  norm_before_fc: bool = False
  fc_norm: bool = False
  norm_output: bool = False

  def setup(self):
    c = self.config
    if self.norm_before_fc:
      self.input_norm = RMSNorm(c.rms_norm_eps)
    if self.fc_norm:
      self.tap_norms = [RMSNorm(c.rms_norm_eps, name=f"fc_norm_{j}") for j in range(NUM_TAPS)]
    self.fc = Linear(c.hidden_size)
    self.midlayer = Eagle3Layer(c, self.norm_before_residual)
    self.norm = RMSNorm(c.rms_norm_eps)
    self.lm_head = Linear(self.draft_vocab_size)

  def fuse(self, taps_BTX):
    if self.norm_before_fc:
      taps_BTX = self.input_norm(taps_BTX)
    if self.fc_norm:
      parts = jnp.split(taps_BTX, NUM_TAPS, axis=-1)
      taps_BTX = jnp.concatenate([n(p) for n, p in zip(self.tap_norms, parts, strict=True)], -1)
    return self.fc(taps_BTX)

  def __call__(self, emb_BTD, h_BTD, positions_BT, cache: KVCache, tree=None):
    x_BTD, k_BSKH, v_BSKH = self.midlayer(
      emb_BTD, h_BTD, positions_BT, cache.k[0], cache.v[0], tree
    )
    if self.norm_output:
      x_BTD = self.norm(x_BTD)
    return x_BTD, KVCache(k=(k_BSKH,), v=(v_BSKH,))

  def logits(self, x_BTD):
    """float32 logits over the DRAFT vocabulary [..., Vd] (norm_output: x is normed already)."""
    h_BTD = x_BTD if self.norm_output else self.norm(x_BTD)
    return self.lm_head(h_BTD).astype(jnp.float32)

  def every_module(self, emb_BTD, taps_BTX, positions_BT, cache):
    """Touches every parameter (init)."""
    x_BTD, _ = self(emb_BTD, self.fuse(taps_BTX), positions_BT, cache)
    return self.logits(x_BTD)


def _module(cfg: Eagle3Config) -> Eagle3Head:
  return Eagle3Head(
    cfg.head,
    cfg.draft_vocab_size,
    cfg.norm_before_residual,
    cfg.norm_before_fc,
    cfg.fc_norm,
    cfg.norm_output,
  )


def _init_args(cfg: Eagle3Config, dtype=jnp.float32):
  tok = jnp.zeros((1, 1), jnp.int32)
  emb = jnp.zeros((1, 1, cfg.head.hidden_size), dtype)
  taps = jnp.zeros((1, 1, NUM_TAPS * cfg.target_hidden_size), dtype)
  return emb, taps, tok, KVCache.zeros(cfg.head, 1, 1, dtype)


# Jitted: eager initialisation compiles one random-normal per parameter shape.
@functools.partial(jax.jit, static_argnames=("cfg", "dtype"))
def init_head(cfg: Eagle3Config, key, dtype=jnp.float32) -> dict:
  params = _module(cfg).init(key, *_init_args(cfg, dtype), method="every_module")
  return jax.tree.map(lambda p: p.astype(dtype), params)


@dataclasses.dataclass(frozen=True)
class Eagle3(heads.ChainedHead):
  name = "eagle3"
  spec: Eagle3Config | None = None
  # weights: {"head": Eagle3Head variables, "embed": [V, D], "draft_ids": int32 [Vd]}
  weights: Any = heads.weights_field()
  own_embed: bool = False  # the embedding came with the head (else it is the target's array)

  @property
  def params(self):
    return self.weights

  @property
  def module(self) -> Eagle3Head:
    return _module(self.spec)

  def validate(self, target_config, k, slots):
    self.spec.check(target_config)

  def features(self, params, target):
    taps_BTX = jnp.concatenate(target.taps, -1)
    return self.module.apply(params["head"], taps_BTX, method="fuse")

  def forward(self, params, h_BTD, tokens_BT, positions_BT, cache, tree=None):
    emb_BTD = jnp.take(params["embed"], tokens_BT, axis=0).astype(self.dtype)
    h_BTD = h_BTD.astype(self.dtype)
    return self.module.apply(params["head"], emb_BTD, h_BTD, positions_BT, cache, tree)

  @property
  def draft_vocab_size(self) -> int:
    return self.spec.draft_vocab_size

  def draft_logits(self, params, out_BD):
    return self.module.apply(params["head"], out_BD, method="logits")

  def logits(self, params, out_BD):
    # Target ids outside the draft vocabulary can never be drafted: -inf, so q(x) = 0 there.
    logits_BVd = self.draft_logits(params, out_BD)
    full_BV = jnp.full(logits_BVd.shape[:-1] + (self.spec.head.vocab_size,), -jnp.inf)
    return full_BV.at[..., params["draft_ids"]].set(logits_BVd)


def eagle3(
  target,
  params=None,
  *,
  config: Eagle3Config | None = None,
  draft_ids=None,
  embed=None,
  seed: int = 0,
) -> Eagle3:
  """An EAGLE-3 drafter for `target` (a specdec.Model).

  params: the head's variables (trained, or from `load_eagle3`); None initialises a random head.
  config: default `make_config(target.config)` (full vocabulary, default taps).
  draft_ids: int [Vd], the target id of each draft id (default: the identity, Vd == V).
  embed: [V, D] embedding shipped with the head; None shares the target's (no copy).
  """
  cfg = (config or make_config(target.config)).check(target.config)
  if params is None:
    params = init_head(cfg, jax.random.key(seed), target.dtype)
  if draft_ids is None:
    if cfg.draft_vocab_size != cfg.head.vocab_size:
      raise ValueError("eagle3: a reduced draft vocabulary needs draft_ids (d2t)")
    draft_ids = np.arange(cfg.draft_vocab_size)
  own = embed is not None
  if not own:
    embed = target.params["params"]["embed"]["embedding"]
  return Eagle3(
    taps=cfg.taps,
    head_config=cfg.head,
    dtype=target.dtype,
    spec=cfg,
    weights={
      "head": jax.tree.map(lambda p: jnp.asarray(p, target.dtype), params),
      "embed": jnp.asarray(embed, target.dtype),
      "draft_ids": jnp.asarray(draft_ids, jnp.int32),
    },
    own_embed=own,
  )


def draft_vocab_from_tokens(tokens, size: int, vocab_size: int) -> np.ndarray:
  """EAGLE-3's draft vocabulary: the `size` most frequent target ids in a corpus (ties to the
  lower id), sorted ascending so d2t offsets are >= 0."""
  counts = np.bincount(np.asarray(tokens).ravel(), minlength=vocab_size)[:vocab_size]
  order = np.lexsort((np.arange(vocab_size), -counts))
  return np.sort(order[:size]).astype(np.int32)


# --- Checkpoint layout ------------------------------------------------------------------------


def tensor_names(cfg: Eagle3Config, layer_prefix: str = "midlayer.") -> dict:
  shapes = heads.param_shapes(_module(cfg), *_init_args(cfg), method="every_module")
  out = {}
  for path in shapes:
    name, transpose = heads.hf_style_name(path)
    if name.startswith("fc_norm_"):  # speculators' ModuleList fc_norm.{j}
      name = "fc_norm." + name.removeprefix("fc_norm_")
    out[path] = (name.replace("midlayer.", layer_prefix, 1), transpose)
  return out, shapes


def load_eagle3(path: str, target) -> Eagle3:
  """Reads a published EAGLE-3 head (config.json + safetensors) for `target`."""
  file = os.path.join(path, "config.json")
  if not os.path.exists(file):
    raise CheckpointError(f"{file}: not found")
  with open(file) as f:
    d = json.load(f)
  try:
    cfg = from_hf_dict(d, target.config, source=file)
  except (ValueError, model_config.ConfigError) as e:
    raise CheckpointError(str(e)) from e
  files = checkpoint_files(path)
  layer_prefix = "midlayer."
  if not any(n.startswith("midlayer.") for n in files) and any(
    n.startswith("layers.0.") for n in files
  ):
    layer_prefix = "layers.0."

  names, shapes = tensor_names(cfg, layer_prefix)
  extras = ("d2t", "t2d", "embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight")
  flat, found = heads.read_head(path, names, shapes, lambda name: True, extras)
  embed = found.get("embed_tokens.weight")
  want = (cfg.head.vocab_size, cfg.head.hidden_size)
  if embed is not None and embed.shape != want:
    raise CheckpointError(
      f"{path}: tensor 'embed_tokens.weight' has shape {embed.shape}, expected {want}"
    )
  if embed is None and cfg.head.hidden_size != target.config.hidden_size:
    raise CheckpointError(
      f"{path}: no 'embed_tokens.weight', and hidden_size {cfg.head.hidden_size} differs from "
      f"the target's {target.config.hidden_size}, so the target's embedding cannot be shared"
    )
  return eagle3(
    target,
    heads.as_params(flat, target.dtype),
    config=cfg,
    draft_ids=draft_ids_from_tensors(found, cfg.draft_vocab_size, cfg.head.vocab_size, path),
    embed=None if embed is None else embed.astype(np.float32),
  )


FORMATS = ("legacy", "speculators")


def save_eagle3(path: str, drafter: Eagle3, dtype=None, *, format: str = "legacy") -> None:
  """Writes a published layout that `load_eagle3` reads: "legacy" (LlamaForCausalLMEagle3,
  midlayer.*: EAGLE, SGLang, vLLM) or "speculators" (vLLM's format, layers.0.*)."""
  if format not in FORMATS:
    raise ValueError(f"save_eagle3: format {format!r} is not one of {', '.join(FORMATS)}")
  cfg = drafter.spec
  if format == "speculators":
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    config, prefix = speculators.eagle3_dict(cfg.head, fields), "layers.0."
  else:
    config, prefix = to_hf_dict(cfg), "midlayer."
  os.makedirs(path, exist_ok=True)
  names, _ = tensor_names(cfg, prefix)
  extras = vocab_tensors(drafter.weights["draft_ids"], cfg.head.vocab_size)
  # The speculators format ships the embedding even when it is the target's, as speculators' own
  # saves do: its loader (0.9.0, transformers 5) leaves a missing one uninitialised.
  if drafter.own_embed or format == "speculators":
    extras["embed_tokens.weight"] = np.asarray(
      jnp.asarray(drafter.weights["embed"], dtype or drafter.dtype)
    )
  flat = heads.flat_params(drafter.weights["head"])
  heads.write_head(os.path.join(path, "model.safetensors"), flat, names, extras, dtype)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
