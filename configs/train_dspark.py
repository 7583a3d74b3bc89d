"""The zoo's DSpark drafter: the block-8 backbone with DSpark's heads as speculators ships them
by default (every row drafts, the anchor's included: 8 drafts per forward; a vanilla Markov
head; a confidence head over [h, w1[prev]]), the Markov rank cut from the default 256 to 32 to
fit the zoo's size budget (as DFlash2's selector rank is), trained with specforge's DSpark
objective (0.1 CE + 0.9 total variation + the confidence BCE) and written in the speculators
layout, the one vLLM loads."""

from configs import train_block8


def get_config():
  c = train_block8.get_config()
  c.drafter.update(
    dict(sample_from_anchor=True, markov_rank=32, markov_head_type="vanilla", confidence_head=True)
  )
  c.export_format = "speculators"
  return c
