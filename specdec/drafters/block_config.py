"""The block drafter's static description (DFlash / DFlash2) and its HF `config.json` mapping.

Published layout (z-lab DFlash `DFlashDraftModel`, DFlash2 `DFlash2DraftModel`): Qwen3 keys for the
draft layers, plus `block_size` / `num_target_layers` at the top level and a `dflash_config` dict
with `block_size`, `mask_token_id`, `target_layer_ids` and, for DFlash2, `conv_kernel_size`,
`conv_group_size`, `selector_rank`, `selector_top_k`, and optionally `input_embedding_scale`,
`output_multiplier`, `final_logit_softcapping`. Draft attention windows come from `layer_types`
("sliding_attention" layers use `sliding_window`); a sliding layer is causal inside the block unless
`is_causal` says otherwise (z-lab's rule), `is_causal: true` makes every layer causal.

The speculators (vLLM) layout is told apart by its `speculators_model_type` key ("dflash",
"dflash2"); `speculators.py` maps it onto this same BlockConfig.
"""

import dataclasses
from typing import Any

from specdec.models import config as model_config
from specdec.models.config import ModelConfig

ARCH_DFLASH = "DFlashDraftModel"
ARCH_DFLASH2 = "DFlash2DraftModel"
# The draft has no learned positions; HF configs carry the key, ours only needs it to exist.
_NO_POSITION_LIMIT = 1 << 20


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
  """DFlash's default taps: uniform from layer 1 to layer N-3 (Python rounding, as published)."""
  if num_draft_layers == 1:
    return (num_target_layers // 2,)
  start, end = 1, num_target_layers - 3
  return tuple(
    int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)
  )


def default_gamma(block_size: int) -> float:
  """Loss-decay constant of DFlash Eq. 4: the paper's values for b = 16, 10, 8, else (b-1)/2."""
  return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, (block_size - 1) / 2)


@dataclasses.dataclass(frozen=True)
class BlockConfig:
  layers: ModelConfig  # the draft decoder layers; vocab_size and hidden_size are the target's
  target_layer_ids: tuple[int, ...]  # tap i = output of target decoder layer i
  block_size: int  # b: [anchor, MASK x (b-1)] drafts b-1 tokens per forward
  mask_token_id: int
  windows: tuple[int | None, ...] = ()  # per draft layer; None: the whole committed context
  conv_kernel_size: int = 0  # DFlash2 dynamic conv taps per side; 0: off
  conv_group_size: int = 16  # channels sharing one dynamic coefficient
  selector_top_k: int = 0  # DFlash2 candidate selector; 0: off
  selector_rank: int = 0
  num_target_layers: int | None = None
  causal: tuple[bool, ...] = ()  # per draft layer: block rows see only earlier rows; (): none
  embed_scale: float = 1.0  # the block rows' embeddings are multiplied by this
  logit_scale: float = 1.0  # draft logits are multiplied by this, then ...
  logit_softcap: float = 0.0  # ... capped as cap * tanh(logits / cap); 0: off
  draft_vocab_size: int = 0  # > 0: the draft has its own lm_head over this many target ids
  sample_from_anchor: bool = False  # DSpark: the anchor row drafts too (b drafts per forward)
  markov_rank: int = 0  # DSpark's sequential logit bias from the previous token; 0: off
  markov_head_type: str = "vanilla"  # "vanilla" | "gated" | "rnn"
  confidence_head: int = 0  # DSpark's acceptance predictor: its input width (0: none); unused

  @property
  def conv(self) -> bool:
    return self.conv_kernel_size > 0

  @property
  def selector(self) -> bool:
    return self.selector_top_k > 0

  @property
  def hidden_size(self) -> int:
    return self.layers.hidden_size

  @property
  def reduced_vocab(self) -> bool:
    return self.draft_vocab_size > 0

  @property
  def markov(self) -> bool:
    return self.markov_rank > 0

  @property
  def drafts_per_forward(self) -> int:
    return self.block_size if self.sample_from_anchor else self.block_size - 1

  def window(self, layer: int) -> int | None:
    return self.windows[layer] if self.windows else None

  def is_causal(self, layer: int) -> bool:
    return self.causal[layer] if self.causal else False

  def replace(self, **kw) -> "BlockConfig":
    return dataclasses.replace(self, **kw)

  def check(self, source: str = "block drafter") -> "BlockConfig":
    """Internal consistency; raises ValueError naming the key."""
    c = self.layers
    if self.block_size < 2:
      raise ValueError(
        f"{source}: block_size must be >= 2 (anchor + >= 1 mask), got {self.block_size}"
      )
    if not self.target_layer_ids:
      raise ValueError(f"{source}: target_layer_ids is empty")
    ids = list(self.target_layer_ids)
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
      raise ValueError(f"{source}: target_layer_ids {ids} repeats layer id(s) {dup}")
    if not 0 <= self.mask_token_id < c.vocab_size:
      raise ValueError(f"{source}: mask_token_id {self.mask_token_id} outside [0, {c.vocab_size})")
    if self.windows and len(self.windows) != c.num_layers:
      raise ValueError(f"{source}: {len(self.windows)} layer windows for {c.num_layers} layers")
    if self.causal and len(self.causal) != c.num_layers:
      raise ValueError(f"{source}: {len(self.causal)} layer causal flags for {c.num_layers} layers")
    if self.logit_softcap < 0 or self.logit_scale <= 0 or self.embed_scale <= 0:
      raise ValueError(
        f"{source}: final_logit_softcapping must be >= 0 and output_multiplier, "
        f"input_embedding_scale > 0, got {self.logit_softcap}, {self.logit_scale}, "
        f"{self.embed_scale}"
      )
    if not 0 <= self.draft_vocab_size <= c.vocab_size:
      raise ValueError(
        f"{source}: draft_vocab_size {self.draft_vocab_size} outside [1, {c.vocab_size}]"
      )
    if self.reduced_vocab and self.selector:
      raise ValueError(
        f"{source}: a reduced draft vocabulary (draft_vocab_size {self.draft_vocab_size}) with "
        "the DFlash2 candidate selector is not supported (speculators refuses it too)"
      )
    if self.markov and self.markov_head_type not in MARKOV_HEAD_TYPES:
      raise ValueError(
        f"{source}: markov_head_type {self.markov_head_type!r} is not one of "
        f"{', '.join(MARKOV_HEAD_TYPES)}"
      )
    if self.markov and self.selector:
      raise ValueError(f"{source}: a Markov head with the DFlash2 selector is not supported")
    if any(w is not None and w < 1 for w in self.windows):
      raise ValueError(f"{source}: sliding_window must be >= 1, got {self.windows}")
    if self.conv and c.hidden_size % self.conv_group_size:
      raise ValueError(
        f"{source}: conv_group_size {self.conv_group_size} does not divide hidden_size "
        f"{c.hidden_size}"
      )
    if self.selector and not (1 <= self.selector_top_k <= c.vocab_size and self.selector_rank >= 1):
      raise ValueError(
        f"{source}: selector needs 1 <= selector_top_k <= vocab and selector_rank >= 1, got "
        f"top_k={self.selector_top_k}, rank={self.selector_rank}"
      )
    return self


def make_config(
  target: ModelConfig,
  *,
  num_layers: int = 1,
  block_size: int = 8,
  target_layer_ids: tuple[int, ...] | None = None,
  mask_token_id: int | None = None,
  intermediate_size: int | None = None,
  sliding_window: int | None = None,
  conv: bool = False,
  conv_kernel_size: int = 2,
  conv_group_size: int = 16,
  selector: bool = False,
  selector_top_k: int = 16,
  selector_rank: int = 64,
  sample_from_anchor: bool = False,
  markov_rank: int = 0,
  markov_head_type: str = "vanilla",
  confidence_head: bool = False,
) -> BlockConfig:
  """A new drafter for `target`: draft layers with the target's width, heads and RoPE.

  The mask token defaults to the last vocabulary id (pick one the target never emits: the
  embedding of the mask is the target's own embedding row, frozen). DSpark: sample_from_anchor,
  a Markov head of rank markov_rank, a confidence head (over [h, w1[prev]] with a Markov head,
  else over [h], as speculators' confidence_head_with_markov default)."""
  layers = target.replace(
    num_layers=num_layers,
    intermediate_size=intermediate_size or target.intermediate_size,
    model_type="qwen3",
    qk_norm=True,
    tie_word_embeddings=False,  # the draft has no head of its own
  )
  ids = target_layer_ids or build_target_layer_ids(target.num_layers, num_layers)
  return BlockConfig(
    layers=layers,
    target_layer_ids=tuple(int(i) for i in ids),
    block_size=block_size,
    mask_token_id=target.vocab_size - 1 if mask_token_id is None else mask_token_id,
    windows=(sliding_window,) * num_layers if sliding_window else (),
    conv_kernel_size=conv_kernel_size if conv else 0,
    conv_group_size=conv_group_size,
    selector_top_k=selector_top_k if selector else 0,
    selector_rank=selector_rank if selector else 0,
    num_target_layers=target.num_layers,
    sample_from_anchor=sample_from_anchor,
    markov_rank=markov_rank,
    markov_head_type=markov_head_type,
    confidence_head=(target.hidden_size + markov_rank) if confidence_head else 0,
  ).check()


def layer_windows(d: dict[str, Any], n_layers: int, source: str) -> tuple[int | None, ...]:
  window = d.get("sliding_window")
  types = d.get("layer_types")
  if types is not None:
    if len(types) != n_layers:
      raise ValueError(f"{source}: layer_types has {len(types)} entries for {n_layers} layers")
    unknown = set(types) - {"sliding_attention", "full_attention"}
    if unknown:
      raise ValueError(f"{source}: unsupported layer_types {sorted(unknown)}")
    if "sliding_attention" in types and not window:
      raise ValueError(f"{source}: sliding_attention layers but no sliding_window")
    ws = tuple(int(window) if t == "sliding_attention" else None for t in types)
  elif d.get("use_sliding_window") and window:
    ws = (int(window),) * n_layers
  else:
    ws = ()
  return ws if any(w is not None for w in ws) else ()


def _zlab_causal(d: dict[str, Any], windows: tuple[int | None, ...], n: int) -> tuple[bool, ...]:
  """z-lab's rule (dflash `Qwen3DFlashAttention`): `is_causal` if given, for every layer; absent,
  sliding layers are causal inside the block and full layers bidirectional."""
  if d.get("is_causal") is not None:
    causal = (bool(d["is_causal"]),) * n
  else:
    causal = tuple(w is not None for w in windows) if windows else (False,) * n
  return causal if any(causal) else ()


MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
DFLASH_SCALARS = {  # dflash_config key -> (BlockConfig field, default)
  "input_embedding_scale": ("embed_scale", 1.0),
  "output_multiplier": ("logit_scale", 1.0),
  "final_logit_softcapping": ("logit_softcap", 0.0),
}


DFLASH_CONFIG_KEYS = {
  "block_size",
  "mask_token_id",
  "target_layer_ids",
  "conv_kernel_size",
  "conv_group_size",
  "selector_rank",
  "selector_top_k",
  *DFLASH_SCALARS,
}


def from_hf_dict(d: dict[str, Any], source: str = "config.json") -> BlockConfig:
  if "speculators_model_type" in d:
    raise ValueError(
      f"{source}: a speculators-format config (speculators_model_type "
      f"{d['speculators_model_type']!r}); read it with specdec.drafters.speculators"
    )
  arch = (d.get("architectures") or [ARCH_DFLASH])[0]
  if arch not in (ARCH_DFLASH, ARCH_DFLASH2):
    raise ValueError(f"{source}: architectures {arch!r} is not {ARCH_DFLASH} or {ARCH_DFLASH2}")
  if d.get("hidden_act", "silu") not in ("silu", "swish"):
    raise ValueError(f"{source}: unsupported hidden_act {d['hidden_act']!r} (SwiGLU needs silu)")
  dc = dict(d.get("dflash_config") or {})
  unknown = sorted(set(dc) - DFLASH_CONFIG_KEYS)
  if unknown:
    raise ValueError(
      f"{source}: dflash_config option(s) {unknown} are not implemented in specdec (a key it "
      "does not know could change the drafts)"
    )
  layer_d = {"model_type": "qwen3", "max_position_embeddings": _NO_POSITION_LIMIT, **d}
  layer_d["model_type"] = "qwen3"  # the draft layers are Qwen3 layers whatever the target is
  layers = model_config.from_hf_dict(layer_d, source=source)
  n = layers.num_layers
  block_size = dc.get("block_size", d.get("block_size"))
  if block_size is None:
    raise ValueError(f"{source}: missing block_size (dflash_config.block_size)")
  if "mask_token_id" not in dc:
    raise ValueError(f"{source}: missing dflash_config.mask_token_id")
  num_target = d.get("num_target_layers")
  ids = dc.get("target_layer_ids")
  if ids is None:
    if num_target is None:
      raise ValueError(f"{source}: no dflash_config.target_layer_ids and no num_target_layers")
    ids = build_target_layer_ids(int(num_target), n)
  v2 = arch == ARCH_DFLASH2
  for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
    if v2 and key not in dc:
      raise ValueError(f"{source}: {ARCH_DFLASH2} needs dflash_config.{key}")
  windows = layer_windows(d, n, source)
  scalars = {}
  for key, (field, default) in DFLASH_SCALARS.items():
    value = dc.get(key, d.get(key))
    scalars[field] = default if value is None else float(value)
  return BlockConfig(
    layers=layers,
    target_layer_ids=tuple(int(i) for i in ids),
    block_size=int(block_size),
    mask_token_id=int(dc["mask_token_id"]),
    windows=windows,
    conv_kernel_size=int(dc.get("conv_kernel_size", 0)),
    conv_group_size=int(dc.get("conv_group_size", 16)),
    selector_top_k=int(dc.get("selector_top_k", 0)),
    selector_rank=int(dc.get("selector_rank", 0)),
    num_target_layers=None if num_target is None else int(num_target),
    causal=_zlab_causal(d, windows, n),
    **scalars,
  ).check(source)


def to_hf_dict(cfg: BlockConfig) -> dict[str, Any]:
  d = model_config.to_hf_dict(cfg.layers)
  v2 = cfg.conv or cfg.selector
  dc: dict[str, Any] = {
    "block_size": cfg.block_size,
    "mask_token_id": cfg.mask_token_id,
    "target_layer_ids": list(cfg.target_layer_ids),
  }
  if cfg.conv:
    dc.update(conv_kernel_size=cfg.conv_kernel_size, conv_group_size=cfg.conv_group_size)
  if cfg.selector:
    dc.update(selector_rank=cfg.selector_rank, selector_top_k=cfg.selector_top_k)
  for key, (field, default) in DFLASH_SCALARS.items():
    if getattr(cfg, field) != default:
      dc[key] = getattr(cfg, field)
  if cfg.reduced_vocab or cfg.markov or cfg.confidence_head or cfg.sample_from_anchor:
    raise ValueError(
      "the z-lab DFlash layout has no reduced draft vocabulary, DSpark head or "
      'sample_from_anchor; save it with format="speculators"'
    )
  windows = windows_of(cfg)
  causal = [cfg.is_causal(i) for i in range(cfg.layers.num_layers)]
  if len(set(causal)) > 1 and causal != [w is not None for w in windows]:
    raise ValueError(
      f"the z-lab DFlash layout holds one is_causal for all layers or the sliding-layer "
      f"default; layers are causal {causal}"
    )
  sliding = [w for w in windows if w is not None]
  if len(set(sliding)) > 1:
    raise ValueError(f"config.json holds one sliding_window; layers use {sorted(set(sliding))}")
  d.update(
    architectures=[ARCH_DFLASH2 if v2 else ARCH_DFLASH],
    block_size=cfg.block_size,
    dflash_config=dc,
    layer_types=["full_attention" if w is None else "sliding_attention" for w in windows],
    sliding_window=sliding[0] if sliding else None,
    use_sliding_window=bool(sliding),
  )
  if len(set(causal)) == 1:
    d["is_causal"] = causal[0]
  if cfg.num_target_layers is not None:
    d["num_target_layers"] = cfg.num_target_layers
  return d


def windows_of(cfg: BlockConfig) -> list[int | None]:
  return [cfg.window(i) for i in range(cfg.layers.num_layers)]
