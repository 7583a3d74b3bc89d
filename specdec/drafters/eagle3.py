"""EAGLE-3 as the drafter: three target taps fused by fc, one decoder layer, a reduced vocabulary.

  g_i = fc(cat[low_i, mid_i, high_i])                       (3 Dt -> D, target features only)
  out = midlayer(emb(t_{i+1}), g_i):  q/k/v read cat[input_layernorm(emb), hidden_norm(g)] (2D
        wide), the residual stream starts from g (from hidden_norm(g) with norm_before_residual)
  logits over the draft vocabulary = lm_head(norm(out)); draft id d is target id d + d2t[d]

Deeper drafts feed `out` back in place of g, without fc (EAGLE's cnets.py, vLLM llama_eagle3.py).
Taps: EAGLE-3 records the INPUT of target layers (2, L//2, L-3), i.e. HF hidden_states[i];
our tap j is the output of decoder layer j, so aux id i is tap i - 1. See `heads.py` for pairing,
caching and rollback.

Published layout (safetensors + config.json, `LlamaForCausalLMEagle3`): fc.weight [D, 3 Dt],
midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}.weight,
midlayer.self_attn.{q,k,v}_proj.weight [., 2D], midlayer.self_attn.o_proj.weight,
midlayer.mlp.{gate,up,down}_proj.weight, norm.weight, lm_head.weight [Vd, D], d2t int [Vd]
(offsets), t2d bool [V], optional embed_tokens.weight [V, D] (else the target's embedding).
config.json: draft_vocab_size, target_hidden_size, eagle_aux_hidden_state_layer_ids (top level
or under eagle_config), norm_before_residual. Some exports name the layer layers.0.* instead of
midlayer.*; both load.
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
from specdec.drafters import heads
from specdec.models import config as model_config
from specdec.models.config import ModelConfig
from specdec.models.transformer import MLP, Attention, KVCache, Linear, RMSNorm

ARCH = "LlamaForCausalLMEagle3"
NUM_TAPS = 3


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
  """EAGLE-3's low/mid/high features: the inputs of layers 2, L//2 and L-3."""
  return (2, num_layers // 2, num_layers - 3)


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
  head: ModelConfig  # the draft layer (llama layout); vocab_size is the target's
  draft_vocab_size: int  # Vd
  aux_layer_ids: tuple[int, ...]  # HF hidden_states indices: the inputs of these target layers
  target_hidden_size: int  # Dt
  norm_before_residual: bool = False

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
    if not all(1 <= i <= target.num_layers for i in self.aux_layer_ids):
      raise ValueError(
        f"{source}: eagle_aux_hidden_state_layer_ids {list(self.aux_layer_ids)} must lie in "
        f"[1, {target.num_layers}] for a {target.num_layers}-layer target (0, the embedding "
        "output, is not a tap)"
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
) -> Eagle3Config:
  """A new head for `target`: the target's width, heads and RoPE; a llama layer (no q/k norm)."""
  head = target.replace(
    model_type="llama",
    qk_norm=False,
    num_layers=1,
    intermediate_size=intermediate_size or target.intermediate_size,
  )
  return Eagle3Config(
    head=head,
    draft_vocab_size=draft_vocab_size or target.vocab_size,
    aux_layer_ids=tuple(aux_layer_ids or default_aux_layer_ids(target.num_layers)),
    target_hidden_size=target.hidden_size,
    norm_before_residual=norm_before_residual,
  ).check(target)


def from_hf_dict(d: dict, target: ModelConfig, source: str = "config.json") -> Eagle3Config:
  if int(d.get("num_hidden_layers", 1)) != 1:
    raise ValueError(f"{source}: num_hidden_layers={d['num_hidden_layers']}; EAGLE-3 has one")
  head = model_config.from_hf_dict({**d, "model_type": "llama"}, source=source)
  eagle = d.get("eagle_config") or {}
  ids = d.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
  return Eagle3Config(
    head=head,
    draft_vocab_size=int(d.get("draft_vocab_size") or head.vocab_size),
    aux_layer_ids=tuple(int(i) for i in ids or default_aux_layer_ids(target.num_layers)),
    target_hidden_size=int(d.get("target_hidden_size") or head.hidden_size),
    norm_before_residual=bool(d.get("norm_before_residual", False)),
  ).check(target, source)


def to_hf_dict(cfg: Eagle3Config) -> dict:
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
  def __call__(self, emb_BTD, h_BTD, positions_BT, k_BSKH, v_BSKH):
    c = self.config
    e_BTD = RMSNorm(c.rms_norm_eps, name="input_layernorm")(emb_BTD)
    hn_BTD = RMSNorm(c.rms_norm_eps, name="hidden_norm")(h_BTD)
    x_BTD = hn_BTD if self.norm_before_residual else h_BTD
    # q/k/v project the 2D-wide [embedding, hidden]; o_proj returns to D.
    a_BTD, k_BSKH, v_BSKH = Attention(c, name="self_attn")(
      jnp.concatenate([e_BTD, hn_BTD], -1), positions_BT, k_BSKH, v_BSKH
    )
    x_BTD = x_BTD + a_BTD
    mlp_in_BTD = RMSNorm(c.rms_norm_eps, name="post_attention_layernorm")(x_BTD)
    return x_BTD + MLP(c, name="mlp")(mlp_in_BTD), k_BSKH, v_BSKH


class Eagle3Head(nn.Module):
  config: ModelConfig
  draft_vocab_size: int
  norm_before_residual: bool = False

  def setup(self):
    c = self.config
    self.fc = Linear(c.hidden_size)
    self.midlayer = Eagle3Layer(c, self.norm_before_residual)
    self.norm = RMSNorm(c.rms_norm_eps)
    self.lm_head = Linear(self.draft_vocab_size)

  def fuse(self, taps_BTX):
    return self.fc(taps_BTX)

  def __call__(self, emb_BTD, h_BTD, positions_BT, cache: KVCache):
    x_BTD, k_BSKH, v_BSKH = self.midlayer(emb_BTD, h_BTD, positions_BT, cache.k[0], cache.v[0])
    return x_BTD, KVCache(k=(k_BSKH,), v=(v_BSKH,))

  def logits(self, x_BTD):
    """float32 logits over the DRAFT vocabulary [..., Vd]."""
    return self.lm_head(self.norm(x_BTD)).astype(jnp.float32)

  def every_module(self, emb_BTD, taps_BTX, positions_BT, cache):
    """Touches every parameter (init)."""
    x_BTD, _ = self(emb_BTD, self.fuse(taps_BTX), positions_BT, cache)
    return self.logits(x_BTD)


def _module(cfg: Eagle3Config) -> Eagle3Head:
  return Eagle3Head(cfg.head, cfg.draft_vocab_size, cfg.norm_before_residual)


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

  def forward(self, params, h_BTD, tokens_BT, positions_BT, cache):
    emb_BTD = jnp.take(params["embed"], tokens_BT, axis=0).astype(self.dtype)
    return self.module.apply(params["head"], emb_BTD, h_BTD.astype(self.dtype), positions_BT, cache)

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
    out[path] = (name.replace("midlayer.", layer_prefix, 1), transpose)
  return out, shapes


def _draft_ids(found: dict, cfg: Eagle3Config, path: str) -> np.ndarray:
  Vd, V = cfg.draft_vocab_size, cfg.head.vocab_size
  if "d2t" not in found:
    if Vd != V:
      raise CheckpointError(f"{path}: missing tensor 'd2t' (draft_vocab_size {Vd} < vocab {V})")
    return np.arange(V, dtype=np.int32)
  d2t = found["d2t"]
  if d2t.shape != (Vd,) or d2t.dtype.kind not in "iu":
    raise CheckpointError(
      f"{path}: tensor 'd2t' is {d2t.dtype.name} {d2t.shape}; expected integer ({Vd},)"
    )
  ids = np.arange(Vd) + d2t.astype(np.int64)
  if ids.min() < 0 or ids.max() >= V or len(np.unique(ids)) != Vd:
    raise CheckpointError(
      f"{path}: tensor 'd2t' maps draft ids outside [0, {V}) or two onto one target id"
    )
  if "t2d" in found:
    t2d = found["t2d"]
    mask = np.zeros(V, bool)
    mask[ids] = True
    if t2d.shape != (V,) or not np.array_equal(t2d.astype(bool), mask):
      raise CheckpointError(f"{path}: tensor 't2d' disagrees with 'd2t'")
  return ids.astype(np.int32)


def load_eagle3(path: str, target) -> Eagle3:
  """Reads a published EAGLE-3 head (config.json + safetensors) for `target`."""
  file = os.path.join(path, "config.json")
  if not os.path.exists(file):
    raise CheckpointError(f"{file}: not found")
  with open(file) as f:
    d = json.load(f)
  try:
    cfg = from_hf_dict(d, target.config, source=file)
  except model_config.ConfigError as e:
    raise CheckpointError(str(e)) from e
  files = checkpoint_files(path)
  layer_prefix = "midlayer."
  if not any(n.startswith("midlayer.") for n in files) and any(
    n.startswith("layers.0.") for n in files
  ):
    layer_prefix = "layers.0."
  names, shapes = tensor_names(cfg, layer_prefix)
  extras = ("d2t", "t2d", "embed_tokens.weight")
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
    draft_ids=_draft_ids(found, cfg, path),
    embed=None if embed is None else embed.astype(np.float32),
  )


def save_eagle3(path: str, drafter: Eagle3, dtype=None) -> None:
  """Writes the published layout that `load_eagle3` (and EAGLE / vLLM) read."""
  os.makedirs(path, exist_ok=True)
  cfg = drafter.spec
  names, _ = tensor_names(cfg)
  ids = np.asarray(drafter.weights["draft_ids"], np.int64)
  t2d = np.zeros(cfg.head.vocab_size, bool)
  t2d[ids] = True
  extras = {"d2t": ids - np.arange(len(ids)), "t2d": t2d}
  if drafter.own_embed:
    extras["embed_tokens.weight"] = np.asarray(
      jnp.asarray(drafter.weights["embed"], dtype or drafter.dtype)
    )
  flat = heads.flat_params(drafter.weights["head"])
  heads.write_head(os.path.join(path, "model.safetensors"), flat, names, extras, dtype)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(to_hf_dict(cfg), f, indent=2)
