"""The zoo's EAGLE-3 head by the paper's recipe: low, mid and high taps (hidden states 2, L//2 and
L-3 of the target: layer outputs 1, 5 and 8 of 0..11) fused by fc(3H -> H), one layer, training-
time test to depth 7, and a draft vocabulary sized to cover 99% of held-out tokens, ranked by
frequency in the training data (the target's own continuations in the zoo build)."""

import ml_collections

from configs import train_mtp


def get_config():
  c = train_mtp.get_config()
  c.method = "eagle3"
  c.drafter = ml_collections.ConfigDict(
    {"draft_vocab_coverage": 0.99, "aux_layer_ids": (2, 6, 9), "chain": {"depth": 7, "origins": 32}}
  )
  return c
