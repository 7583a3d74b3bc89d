"""Issue 23's ablations: a zoo recipe with one choice changed, to measure why a head misses its bar.

Each trains against the shipped target like the zoo's own models and lands in --out/NAME, never
in the shipped zoo; the `_base` rows are the unchanged recipes at the same step counts, trained in
the same run on the same self-distilled stream, so each ablation has its control beside it.
Steps are the recipes' first counts (eagle3 2000, block8 3000), half the shipped heads'.

  bash experiments/device/zoo_call.sh with MODELS=eagle3_base,eagle3_top_tap,...  (on the GPU)
  python -m experiments.zoo_quality --zoo_dir=DIR --models=eagle3_base,... --n_humaneval=0
"""

import ml_collections

from configs.zoo import CONFIGS
from specdec.training import zoo

# name: (the zoo model it varies, {dotted config key: value}, the question it asks)
ABLATIONS = {
  "eagle3_base": ("eagle3", {"steps": 2000}, "control"),
  "eagle3_top_tap": (
    "eagle3",
    {"steps": 2000, "drafter.aux_layer_ids": (2, 6, 11)},
    "taps: the high tap at the last layer's input (hidden state L-1) instead of L-3",
  ),
  "eagle3_ttt4": (
    "eagle3",
    {"steps": 2000, "drafter.chain.depth": 4},
    "depth: training-time test to 4 (the first zoo's) instead of the paper's 7",
  ),
  "block8_base": ("block8", {"steps": 3000}, "control"),
  "block8_5_layers": (
    "block8",
    {"steps": 3000, "drafter.num_layers": 5},
    "layers: the paper's 5 draft layers instead of 2 (the depth ratio kept)",
  ),
  "block8_1_tap": (
    "block8",
    {"steps": 3000, "drafter.target_layer_ids": (5,)},
    "taps: one mid-network tap (the first zoo's) instead of 5",
  ),
  "block8_corpus": (
    "block8",
    {"steps": 3000, zoo.SELF_DISTILLED: False},
    "data: the corpus (labels the target's argmax after corpus prefixes), not its continuations",
  ),
  "draft_lm_27pct": (
    "draft_lm",
    {
      "model.hidden_size": 192,
      "model.intermediate_size": 512,
      "model.num_hidden_layers": 3,
      "model.num_attention_heads": 4,
      "model.num_key_value_heads": 2,
    },
    "size: the first zoo's draft shape (3 layers, hidden 192) at 27% of the target, not 9.4%",
  ),
}


def kinds() -> dict[str, str]:
  """Each ablation's zoo model."""
  return {name: kind for name, (kind, _, _) in ABLATIONS.items()}


def get_config(name: str) -> ml_collections.ConfigDict:
  """The ablation's training config: its zoo model's recipe with the changed keys set."""
  if name not in ABLATIONS:
    raise ValueError(f"ablation {name!r}: not among {sorted(ABLATIONS)}")
  kind, changes, _ = ABLATIONS[name]
  cfg = CONFIGS[kind].get_config()
  for key, value in changes.items():
    *path, leaf = key.split(".")
    node = cfg
    for part in path:
      node = node[part]
    if leaf not in node and key != zoo.SELF_DISTILLED:
      raise KeyError(f"ablation {name!r}: {key} is not a key of the {kind} recipe")
    node[leaf] = value
  return cfg
