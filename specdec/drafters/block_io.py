"""Published DFlash / DFlash2 checkpoints (config.json + safetensors) <-> block drafters.

Tensor names are the published ones (z-lab `DFlashDraftModel`, `DFlash2DraftModel`), no prefix;
linear weights are stored (out, in) there and (in, out) here:

  fc.weight [D, n_taps * D]                      hidden_norm.weight, norm.weight [D]
  layers.{i}.input_layernorm.weight              layers.{i}.post_attention_layernorm.weight
  layers.{i}.self_attn.{q,k,v,o}_proj.weight     layers.{i}.self_attn.{q,k}_norm.weight [H]
  layers.{i}.mlp.{gate,up,down}_proj.weight
  DSpark (speculators): markov_head.markov_w1.weight [V, r], markov_head.markov_w2.weight [Vd, r],
  markov_head.{gate_proj,joint_proj}.{weight,bias} (gated / rnn), confidence_head.proj.*
  DFlash2:
  layers.{i}.{attention,mlp}_conv.base_kernel [2, taps, D]   (side: before/after; tap 0 = current)
  layers.{i}.{attention,mlp}_conv.kernel_projection.weight [2 * taps * D / group, D]
  candidate_selector.hidden_projection.weight [rank, D]
  candidate_selector.{predecessor,successor}_codebook [V, rank]   (".weight" also accepted)

The embedding and LM head are the target's: `embed_tokens.weight` / `lm_head.weight`, if a file
carries them, are ignored; except that a reduced draft vocabulary (speculators `draft_vocab_size`
< vocab) ships its own `lm_head.weight` [Vd, D] with `d2t` [Vd] (draft id -> target id offset)
and `t2d` bool [V]. The speculators layout (config told apart by `speculators_model_type`, see
`speculators.py`) has the same tensor names. Anything else unknown, missing or misshapen is an
error naming it.
"""

import json
import os

import jax
import numpy as np

from specdec.checkpoint.safetensors_io import (
  CheckpointError,
  checkpoint_files,
  read_tensors,
  write_tensors,
)
from specdec.drafters import speculators
from specdec.drafters.block import Block, block
from specdec.drafters.block_config import BlockConfig, from_hf_dict, to_hf_dict
from specdec.drafters.block_model import init_variables
from specdec.drafters.vocab import draft_ids_from_tensors, vocab_tensors
from specdec.models import config as model_config

IGNORED = ("embed_tokens.weight", "lm_head.weight", "verifier_norm.weight")
FORMATS = ("z-lab", "speculators")


def _tensor_names(cfg: BlockConfig) -> dict[str, tuple[str, bool]]:
  """Every tensor a checkpoint of `cfg` holds: HF name -> (params path, stored transposed)."""
  names = {
    "fc.weight": ("fc/kernel", True),
    "hidden_norm.weight": ("hidden_norm/scale", False),
    "norm.weight": ("final_norm/scale", False),
  }
  for i in range(cfg.layers.num_layers):
    hf, ours = f"layers.{i}.", f"layer_{i}/"
    names[hf + "input_layernorm.weight"] = (ours + "attn_norm/scale", False)
    names[hf + "post_attention_layernorm.weight"] = (ours + "mlp_norm/scale", False)
    for p in "qkvo":
      names[hf + f"self_attn.{p}_proj.weight"] = (ours + f"attn/{p}_proj/kernel", True)
      if cfg.layers.attention_bias:
        names[hf + f"self_attn.{p}_proj.bias"] = (ours + f"attn/{p}_proj/bias", False)
    for p in "qk":
      names[hf + f"self_attn.{p}_norm.weight"] = (ours + f"attn/{p}_norm/scale", False)
    for p in ("gate", "up", "down"):
      names[hf + f"mlp.{p}_proj.weight"] = (ours + f"mlp/{p}_proj/kernel", True)
    if cfg.conv:
      for side in ("attention", "mlp"):
        names[hf + f"{side}_conv.base_kernel"] = (ours + f"{side}_conv/base_kernel", False)
        names[hf + f"{side}_conv.kernel_projection.weight"] = (
          ours + f"{side}_conv/kernel_projection/kernel",
          True,
        )
  if cfg.selector:
    names["candidate_selector.hidden_projection.weight"] = (
      "selector/hidden_projection/kernel",
      True,
    )
    for book in ("predecessor", "successor"):
      names[f"candidate_selector.{book}_codebook"] = (f"selector/{book}_codebook", False)
  if cfg.reduced_vocab:
    names["lm_head.weight"] = ("lm_head/kernel", True)
  if cfg.markov:
    names["markov_head.markov_w1.weight"] = ("markov_head/markov_w1", False)
    names["markov_head.markov_w2.weight"] = ("markov_head/markov_w2/kernel", True)
    proj = {"gated": "gate_proj", "rnn": "joint_proj"}.get(cfg.markov_head_type)
    if proj:
      names[f"markov_head.{proj}.weight"] = (f"markov_head/{proj}/kernel", True)
      names[f"markov_head.{proj}.bias"] = (f"markov_head/{proj}/bias", False)
  if cfg.confidence_head:
    names["confidence_head.proj.weight"] = ("confidence_head/proj/kernel", True)
    names["confidence_head.proj.bias"] = ("confidence_head/proj/bias", False)
  return names


def _expected_shapes(cfg: BlockConfig, target_hidden: int) -> dict[str, tuple[int, ...]]:
  """params path -> shape, from the module itself (no separate shape table to drift)."""
  shapes = jax.eval_shape(lambda: init_variables(cfg, jax.random.key(0), np.float32, target_hidden))
  flat = jax.tree_util.tree_flatten_with_path(shapes["params"])[0]
  return {"/".join(k.key for k in path): tuple(leaf.shape) for path, leaf in flat}


def _alias(name: str, present) -> str:
  """The codebooks ship with or without a `.weight` suffix."""
  if name.endswith("_codebook") and name not in present and name + ".weight" in present:
    return name + ".weight"
  return name


def _check_against_target(cfg: BlockConfig, target_config, source: str) -> None:
  t = target_config
  if cfg.hidden_size != t.hidden_size:
    raise ValueError(
      f"{source}: drafter hidden_size {cfg.hidden_size} (norm.weight, fc.weight rows) differs "
      f"from the target's {t.hidden_size}; its output goes through the target's LM head"
    )
  if cfg.layers.vocab_size != t.vocab_size:
    raise ValueError(f"{source}: vocab_size {cfg.layers.vocab_size} != target's {t.vocab_size}")
  bad = [i for i in cfg.target_layer_ids if not 0 <= i < t.num_layers]
  if bad:
    raise ValueError(f"{source}: target_layer_ids {bad} outside the target's {t.num_layers} layers")


def _set(tree: dict, path: str, value) -> None:
  *heads, leaf = path.split("/")
  for h in heads:
    tree = tree.setdefault(h, {})
  tree[leaf] = value


def load_config(path: str) -> BlockConfig:
  """The BlockConfig of a z-lab or speculators DFlash / DFlash2 checkpoint directory."""
  d, file = model_config.read_config_json(path)
  if speculators.model_type(d, file) is not None:
    return speculators.block_config(d, file)
  return from_hf_dict(d, source=file)


def load_block(path: str, target, *, dtype=None, sliding_window: int | None = None) -> Block:
  """A block drafter for `target` from a DFlash / DFlash2 checkpoint directory (the z-lab or the
  speculators layout, told apart by the config's keys).

  dtype: of the draft weights (default: the target's). sliding_window overrides the config's.
  """
  source = os.path.join(path, "config.json")
  try:
    cfg = load_config(path)
  except (ValueError, model_config.ConfigError) as e:
    raise CheckpointError(str(e)) from e
  _check_against_target(cfg, target.config, source)
  files = checkpoint_files(path)
  names = _tensor_names(cfg)
  shapes = _expected_shapes(cfg, target.config.hidden_size)
  known = {_alias(n, files) for n in names}
  vocab_names = ("d2t", "t2d") if cfg.reduced_vocab else ()
  for name, file in sorted(files.items()):
    if name in known or name in vocab_names or name in IGNORED:
      continue
    if name.endswith("rotary_emb.inv_freq"):
      continue
    why = "no block-drafter parameter has that name"
    if name in ("d2t", "t2d"):
      why = "a reduced draft vocabulary, but draft_vocab_size is the full vocabulary"
    raise CheckpointError(f"{file}: unexpected tensor {name!r} ({why})")
  params: dict = {}
  for name, (ours, transpose) in names.items():
    stored = _alias(name, files)
    if stored not in files:
      kind = "DFlash2" if cfg.conv or cfg.selector else "DFlash"
      raise CheckpointError(f"{path}: missing tensor {name!r} (a {kind} checkpoint needs it)")
    raw = read_tensors(files[stored], [stored])[stored]
    want = shapes[ours][::-1] if transpose else shapes[ours]
    if raw.shape != want:
      hint = ""
      if name == "fc.weight":
        n, d = len(cfg.target_layer_ids), target.config.hidden_size
        hint = f" ({n} taps x target hidden {d} = {n * d} inputs per config target_layer_ids)"
      raise CheckpointError(
        f"{files[stored]}: tensor {stored!r} has shape {raw.shape}, expected {want}{hint}"
      )
    a = raw.T if transpose else raw
    _set(params, ours, np.asarray(a, dtype or target.dtype))
  draft_ids = None
  if cfg.reduced_vocab:
    found = {n: read_tensors(files[n], [n])[n] for n in ("d2t", "t2d") if n in files}
    draft_ids = draft_ids_from_tensors(found, cfg.draft_vocab_size, cfg.layers.vocab_size, path)
  return block(target, {"params": params}, cfg, sliding_window=sliding_window, draft_ids=draft_ids)


def save_block(
  path: str, cfg: BlockConfig, draft_params, dtype=None, *, format="z-lab", draft_ids=None
) -> None:
  """Writes `cfg` and `draft_params` ({"params": ...}) in a published layout.

  format: "z-lab" (DFlashDraftModel / DFlash2DraftModel config) or "speculators" (vLLM's
  format; a reduced vocabulary writes lm_head, d2t and t2d from `draft_ids`)."""
  if format not in FORMATS:
    raise ValueError(f"save_block: format {format!r} is not one of {', '.join(FORMATS)}")
  config = speculators.block_dict(cfg) if format == "speculators" else to_hf_dict(cfg)
  os.makedirs(path, exist_ok=True)
  flat = dict(
    ("/".join(k.key for k in p), leaf)
    for p, leaf in jax.tree_util.tree_flatten_with_path(draft_params["params"])[0]
  )
  tensors = {}
  for name, (ours, transpose) in _tensor_names(cfg).items():
    if ours not in flat:
      raise ValueError(f"save_block: params have no {ours!r} (for tensor {name!r})")
    a = np.asarray(flat.pop(ours))
    a = a.T if transpose else a
    tensors[name] = np.ascontiguousarray(a.astype(dtype) if dtype is not None else a)
  if flat:
    raise ValueError(f"save_block: params {sorted(flat)} have no tensor name in this layout")
  if cfg.reduced_vocab:
    if draft_ids is None:
      raise ValueError("save_block: a reduced-vocabulary draft needs draft_ids (for d2t / t2d)")
    tensors.update(vocab_tensors(draft_ids, cfg.layers.vocab_size))
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
  write_tensors(os.path.join(path, "model.safetensors"), tensors)
