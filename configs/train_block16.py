"""The zoo's DFlash block drafter, b = 16 (the block size DFlash ships for Qwen3); otherwise the
block-8 recipe."""

from configs import train_block8


def get_config():
  c = train_block8.get_config()
  c.drafter.block_size = 16
  c.eval_k = 15
  return c
