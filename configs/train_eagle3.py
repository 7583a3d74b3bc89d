"""The zoo's EAGLE-3 head: three target taps fused by fc(3H -> H), one layer, a 2048-token draft
vocabulary (the most frequent corpus tokens), training-time test to depth 4."""

import ml_collections

from configs import train_mtp


def get_config():
  c = train_mtp.get_config()
  c.method = "eagle3"
  c.drafter = ml_collections.ConfigDict(
    {"draft_vocab_size": 2048, "chain": {"depth": 4, "origins": 32}}
  )
  return c
