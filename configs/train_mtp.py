"""The zoo's MTP head (Qwen3-Next layout): one decoder layer on [embedding, target hidden],
trained with chained drafting to depth 7 so that k up to 7 drafts are trained too."""

import ml_collections

from configs import train_block8


def get_config():
  c = train_block8.get_config()
  c.method = "mtp"
  c.drafter = ml_collections.ConfigDict({"chain": {"depth": 7, "origins": 32}})
  c.loss = ml_collections.ConfigDict()
  c.batch_size = 16
  c.steps = 4000
  c.eval_k = 7
  return c
