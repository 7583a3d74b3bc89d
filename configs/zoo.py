"""The zoo build's recipes by model name (experiments.build_zoo), and its drafter data."""

from configs import (
  selfdistill,
  train_block8,
  train_block16,
  train_dflash2,
  train_draft_lm,
  train_dspark,
  train_eagle3,
  train_hybrid,
  train_hybrid_mtp,
  train_mtp,
  train_target,
)

CONFIGS = {
  "target": train_target,
  "draft_lm": train_draft_lm,
  "mtp": train_mtp,
  "eagle3": train_eagle3,
  "block8": train_block8,
  "block16": train_block16,
  "dflash2": train_dflash2,
  "dspark": train_dspark,
  "hybrid": train_hybrid,
  "hybrid_mtp": train_hybrid_mtp,
  "selfdistill": selfdistill,  # every target's drafter data
}
