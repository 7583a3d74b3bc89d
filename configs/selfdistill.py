"""The zoo's drafter data: the target's own continuations of corpus prefixes
(`specdec.training.selfdistill`), half greedy, half sampled at T = 0.6: 16384 rows of 64 corpus
tokens + up to 960 generated, ~16M tokens, generated on the GPU once per target and cached."""

import ml_collections


def get_config():
  return ml_collections.ConfigDict(
    dict(rows=16384, prompt_tokens=64, new_tokens=960, temperatures=(0.0, 0.6), batch=512, seed=0)
  )
