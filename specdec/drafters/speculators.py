"""The speculators (vLLM) drafter format: configs and tensor names, mapped onto specdec's drafters.

A speculators config.json is told apart from the z-lab / EAGLE layouts by its keys, not by
`architectures` (a converted DFlash keeps z-lab's name): it has `speculators_model_type` and the
draft layers under `transformer_layer_config`. Per type:

  dflash, dflash2, dspark
                   aux_hidden_state_layer_ids (vLLM's ids: id i is the INPUT of target layer i,
                   0 the embedding output, so z-lab's target_layer_ids + 1), mask_token_id,
                   block_size, draft_vocab_size (< vocab: lm_head + d2t + t2d ship),
                   sliding_window_non_causal (false: sliding layers are causal inside the block;
                   full layers are always bidirectional), sample_from_anchor (the anchor row
                   drafts too), dflash2: conv_kernel_size, conv_group_size, selector_rank,
                   selector_top_k; dspark: markov_rank, markov_head_type,
                   enable_confidence_head, confidence_head_with_markov.
  eagle3           eagle_aux_hidden_state_layer_ids (vLLM's ids), draft_vocab_size,
                   norm_before_residual, norm_before_fc, fc_norm, norm_output,
                   target_hidden_size; the layer is llama or qwen3 (q/k norms).
  mtp              num_nextn_predict_layers (1); the layer is the target family's.

Tensor names: DFlash as z-lab's (plus lm_head / d2t / t2d for a reduced vocabulary); EAGLE-3
`layers.0.*` with `input_norm.weight` (norm_before_fc) or `fc_norm.{j}.weight` (fc_norm); MTP
`mtp_layers.0.{token_layernorm, hidden_layernorm, input_proj, final_layernorm, <decoder layer>}`.
"""

from typing import Any

from specdec.drafters.block_config import BlockConfig, layer_windows, windows_of
from specdec.models import config as model_config

KEY = "speculators_model_type"
SUPPORTED = ("dflash", "dflash2", "dspark", "eagle3", "mtp")
BLOCK_KINDS = ("dflash", "dflash2", "dspark")
REFUSED = {
  "peagle": "parallel EAGLE drafters are not implemented in specdec",
  "xpress": "Xpress drafters are not implemented in specdec",
}
_NO_POSITION_LIMIT = 1 << 20
# Keys every speculators config carries that do not change what the drafter computes.
_COMMON = {
  KEY,
  "architectures",
  "auto_map",
  "dtype",
  "torch_dtype",
  "speculators_config",
  "speculators_version",
  "tie_word_embeddings",
  "transformer_layer_config",
  "transformers_version",
}
_DFLASH = {
  "aux_hidden_state_layer_ids",
  "block_size",
  "draft_vocab_size",
  "mask_token_id",
  "sample_from_anchor",
  "sliding_window_non_causal",
  "target_hidden_size",
}
KNOWN = {
  "dflash": _COMMON | _DFLASH,
  "dflash2": _COMMON
  | _DFLASH
  | {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"},
  "eagle3": _COMMON
  | {
    "draft_vocab_size",
    "eagle_aux_hidden_state_layer_ids",
    "embed_requires_grad",  # training only
    "fc_norm",
    "norm_before_fc",
    "norm_before_residual",
    "norm_output",
    "target_hidden_size",
  },
  "mtp": _COMMON | {"num_nextn_predict_layers"},
  "dspark": _COMMON
  | _DFLASH
  | {"markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov"},
}


def model_type(d: dict[str, Any], source: str) -> str | None:
  """The speculators type of a config dict (None: not the speculators format)."""
  if KEY not in d:
    return None
  kind = d[KEY]
  if kind in REFUSED:
    raise ValueError(f"{source}: {KEY} {kind!r}: {REFUSED[kind]}")
  if kind not in SUPPORTED:
    raise ValueError(f"{source}: unknown {KEY} {kind!r}; supported: {', '.join(SUPPORTED)}")
  unknown = sorted(set(d) - KNOWN[kind])
  if unknown:
    raise ValueError(
      f"{source}: speculators {kind} option(s) {unknown} are not implemented in specdec (a key "
      "it does not know could change the drafts)"
    )
  return kind


def layer_dict(d: dict[str, Any], source: str) -> dict[str, Any]:
  tl = d.get("transformer_layer_config")
  if not isinstance(tl, dict):
    raise ValueError(f"{source}: missing transformer_layer_config (a speculators config needs it)")
  return tl


def aux_ids_to_taps(ids, key: str, source: str, num_target_layers: int | None = None):
  """vLLM aux ids (id i = input of target layer i) -> specdec taps (output of layer i - 1).

  Raises naming `key` for a non-list, duplicates, id 0 (the embedding output, no tap) or an id
  past the target's last layer (num_target_layers, when known)."""
  if not isinstance(ids, list | tuple) or not ids or not all(isinstance(i, int) for i in ids):
    raise ValueError(f"{source}: {key} must be a non-empty list of layer ids, got {ids!r}")
  check_layer_ids(ids, key, source, low=1, high=num_target_layers)
  return tuple(int(i) - 1 for i in ids)


def check_layer_ids(ids, key: str, source: str, low: int, high: int | None) -> None:
  """Distinct ids in [low, high] (high None: no upper bound known yet); raises naming `key`."""
  dup = sorted({i for i in ids if list(ids).count(i) > 1})
  if dup:
    raise ValueError(f"{source}: {key} {list(ids)} repeats layer id(s) {dup}")
  bad = [i for i in ids if i < low or (high is not None and i > high)]
  if bad:
    span = f"[{low}, {high}] (a {high}-layer target)" if high is not None else f">= {low}"
    raise ValueError(f"{source}: {key} {list(ids)} has id(s) {bad} outside {span}")


def _layers(tl: dict[str, Any], source: str, model_type_default: str = "qwen3"):
  d = {"max_position_embeddings": _NO_POSITION_LIMIT, **tl}
  d.setdefault("model_type", model_type_default)
  try:
    return model_config.from_hf_dict(d, source=f"{source} transformer_layer_config")
  except model_config.ConfigError as e:
    raise ValueError(str(e)) from e


def block_config(d: dict[str, Any], source: str) -> BlockConfig:
  """A speculators DFlash / DFlash2 / DSpark config -> BlockConfig (draft_vocab_size 0 = full)."""
  kind = model_type(d, source)
  if kind not in BLOCK_KINDS:
    raise ValueError(f"{source}: {KEY} {kind!r} is not a block drafter ({', '.join(BLOCK_KINDS)})")
  tl = layer_dict(d, source)
  if tl.get("hidden_act", "silu") not in ("silu", "swish"):
    raise ValueError(
      f"{source}: unsupported transformer_layer_config.hidden_act {tl['hidden_act']!r}"
    )
  layers = _layers({**tl, "model_type": "qwen3"}, source)
  n = layers.num_layers
  th = d.get("target_hidden_size")
  if th is not None and int(th) != layers.hidden_size:
    raise ValueError(
      f"{source}: target_hidden_size {th} differs from the draft's hidden_size "
      f"{layers.hidden_size}; the block drafter's fc reads taps of the draft's width"
    )
  for key in ("aux_hidden_state_layer_ids", "mask_token_id", "block_size"):
    if d.get(key) is None:
      raise ValueError(f"{source}: missing {key} (a speculators {kind} config needs it)")
  taps = aux_ids_to_taps(d["aux_hidden_state_layer_ids"], "aux_hidden_state_layer_ids", source)
  windows = layer_windows(tl, n, f"{source} transformer_layer_config")
  non_causal = bool(d.get("sliding_window_non_causal", kind == "dflash2"))
  causal = tuple(w is not None and not non_causal for w in windows) if windows else ()
  vd = int(d.get("draft_vocab_size") or layers.vocab_size)
  v2 = {}
  if kind == "dflash2":
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
      if d.get(key) is None:
        raise ValueError(f"{source}: missing {key} (a speculators dflash2 config needs it)")
    v2 = dict(
      conv_kernel_size=int(d["conv_kernel_size"]),
      conv_group_size=int(d["conv_group_size"]),
      selector_rank=int(d["selector_rank"]),
      selector_top_k=int(d["selector_top_k"]),
    )
  if kind == "dspark":
    v2 = _dspark(d, layers)
  return BlockConfig(
    layers=layers,
    target_layer_ids=taps,
    block_size=int(d["block_size"]),
    mask_token_id=int(d["mask_token_id"]),
    windows=windows,
    causal=causal if any(causal) else (),
    draft_vocab_size=vd if vd != layers.vocab_size else 0,
    sample_from_anchor=bool(d.get("sample_from_anchor", kind == "dspark")),
    **v2,
  ).check(source)


def _dspark(d: dict[str, Any], layers) -> dict[str, Any]:
  """DSpark's Markov and confidence heads (speculators' defaults where a key is absent)."""
  rank = int(d.get("markov_rank", 256))
  confidence = bool(d.get("enable_confidence_head", True))
  with_markov = bool(d.get("confidence_head_with_markov", True)) and rank > 0
  return dict(
    markov_rank=rank,
    markov_head_type=str(d.get("markov_head_type", "vanilla")),
    confidence_head=(layers.hidden_size + (rank if with_markov else 0)) if confidence else 0,
  )


def _speculators_config(kind: str, tokens: int, verifier: dict | None) -> dict[str, Any]:
  return {
    "algorithm": kind,
    "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens}],
    "default_proposal_method": "greedy",
    "verifier": verifier or {"name_or_path": None, "architectures": []},
  }


def block_dict(cfg: BlockConfig, verifier: dict | None = None) -> dict[str, Any]:
  """BlockConfig -> a speculators DFlash / DFlash2 config.json dict."""
  kind = "dflash2" if cfg.conv or cfg.selector else "dflash"
  if cfg.markov or cfg.confidence_head:
    kind = "dspark"
  if cfg.conv != cfg.selector:
    raise ValueError("the speculators dflash2 format needs both the conv and the selector")
  for field, default, key in (
    ("embed_scale", 1.0, "input_embedding_scale"),
    ("logit_scale", 1.0, "output_multiplier"),
    ("logit_softcap", 0.0, "final_logit_softcapping"),
  ):
    if getattr(cfg, field) != default:
      raise ValueError(
        f"the speculators {kind} format has no {key} ({field}={getattr(cfg, field)})"
      )
  n = cfg.layers.num_layers
  windows = windows_of(cfg)
  sliding = sorted({w for w in windows if w is not None})
  if len(sliding) > 1:
    raise ValueError(f"config.json holds one sliding_window; layers use {sliding}")
  causal = [cfg.is_causal(i) for i in range(n)]
  if any(c and w is None for c, w in zip(causal, windows, strict=True)):
    raise ValueError("the speculators format has no causal full-attention draft layer")
  if len({c for c, w in zip(causal, windows, strict=True) if w is not None}) > 1:
    raise ValueError("the speculators format holds one sliding_window_non_causal for all layers")
  tl = model_config.to_hf_dict(cfg.layers)
  tl.update(
    layer_types=["full_attention" if w is None else "sliding_attention" for w in windows],
    sliding_window=sliding[0] if sliding else None,
    use_sliding_window=bool(sliding),
  )
  tl.pop("architectures", None)
  arch = {
    "dflash": "DFlashSpeculator",
    "dflash2": "DFlash2DraftModel",
    "dspark": "DSparkSpeculator",
  }
  d: dict[str, Any] = {
    KEY: kind,
    "architectures": [arch[kind]],
    "transformer_layer_config": tl,
    "draft_vocab_size": cfg.draft_vocab_size or cfg.layers.vocab_size,
    "block_size": cfg.block_size,
    "target_hidden_size": None,
    "aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids],
    "mask_token_id": cfg.mask_token_id,
    "sliding_window_non_causal": not any(causal),
    "sample_from_anchor": cfg.sample_from_anchor,
    "speculators_config": _speculators_config(kind, cfg.drafts_per_forward, verifier),
  }
  if kind == "dspark":
    d.update(
      markov_rank=cfg.markov_rank,
      markov_head_type=cfg.markov_head_type,
      enable_confidence_head=bool(cfg.confidence_head),
      confidence_head_with_markov=cfg.confidence_head > cfg.hidden_size,
    )
  if kind == "dflash2":
    d.update(
      conv_kernel_size=cfg.conv_kernel_size,
      conv_group_size=cfg.conv_group_size,
      selector_rank=cfg.selector_rank,
      selector_top_k=cfg.selector_top_k,
    )
  return d


EAGLE3_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def eagle3_fields(d: dict[str, Any], source: str) -> dict[str, Any]:
  """A speculators EAGLE-3 config -> Eagle3Config keyword arguments (head, ids, sizes, flags)."""
  tl = layer_dict(d, source)
  mt = tl.get("model_type", "llama")
  if mt not in ("llama", "qwen3"):
    raise ValueError(
      f"{source}: transformer_layer_config.model_type {mt!r}: EAGLE-3 draft layers are llama "
      "or qwen3"
    )
  if int(tl.get("num_hidden_layers", 1)) != 1:
    raise ValueError(
      f"{source}: transformer_layer_config.num_hidden_layers={tl['num_hidden_layers']}; specdec's "
      "EAGLE-3 head has one decoder layer"
    )
  if tl.get("layer_types") and "sliding_attention" in tl["layer_types"]:
    raise ValueError(f"{source}: a sliding_attention EAGLE-3 layer is not supported (layer_types)")
  head = _layers({**tl, "model_type": mt}, source, mt)
  if d.get("norm_before_fc") and d.get("fc_norm"):
    raise ValueError(f"{source}: norm_before_fc and fc_norm are mutually exclusive")
  ids = d.get("eagle_aux_hidden_state_layer_ids")
  if ids is not None:
    aux_ids_to_taps(ids, "eagle_aux_hidden_state_layer_ids", source)
  return dict(
    head=head,
    draft_vocab_size=int(d.get("draft_vocab_size") or head.vocab_size),
    aux_layer_ids=None if ids is None else tuple(int(i) for i in ids),
    target_hidden_size=int(d.get("target_hidden_size") or head.hidden_size),
    **{flag: bool(d.get(flag, False)) for flag in EAGLE3_FLAGS},
  )


def eagle3_dict(head, fields: dict[str, Any], verifier: dict | None = None) -> dict[str, Any]:
  """Eagle3Config fields -> a speculators EAGLE-3 config.json dict."""
  tl = model_config.to_hf_dict(head)
  tl.pop("architectures", None)
  tl["num_hidden_layers"] = 1
  return {
    KEY: "eagle3",
    "architectures": ["Eagle3Speculator"],
    "transformer_layer_config": tl,
    "draft_vocab_size": fields["draft_vocab_size"],
    "target_hidden_size": fields["target_hidden_size"],
    "eagle_aux_hidden_state_layer_ids": list(fields["aux_layer_ids"]),
    **{flag: bool(fields[flag]) for flag in EAGLE3_FLAGS},
    "speculators_config": _speculators_config("eagle3", 3, verifier),
  }


def mtp_dict(target_config, verifier: dict | None = None) -> dict[str, Any]:
  """A speculators MTP config.json dict for a head whose layer is one of `target_config`'s."""
  tl = model_config.to_hf_dict(target_config)
  tl.pop("architectures", None)
  return {
    KEY: "mtp",
    "architectures": ["MTPDraftModel"],
    "transformer_layer_config": tl,
    "num_nextn_predict_layers": 1,
    "speculators_config": _speculators_config("mtp", 3, verifier),
  }
