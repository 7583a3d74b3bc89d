"""The zoo's DFlash2 drafter: the block-8 recipe plus DFlash2's two-tap dynamic convolutions around
every sublayer and its pairwise candidate selector (top-16 candidates, a rank-32 bilinear
transition), trained with the selector's cross-entropy beside the block loss."""

from configs import train_block8


def get_config():
  c = train_block8.get_config()
  c.drafter.update(dict(conv=True, selector=True, selector_top_k=16, selector_rank=32))
  return c
