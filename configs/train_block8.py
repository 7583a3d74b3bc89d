"""The zoo's DFlash-style block drafter, b = 8: one draft layer fed by taps of the target."""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "block"
  c.target = "zoo:target"
  c.dtype = "bfloat16"
  c.drafter = ml_collections.ConfigDict(
    dict(num_layers=1, block_size=8, mask_token_id=1)  # <|pad|>: never emitted by the target
  )
  c.loss = ml_collections.ConfigDict(dict(anchors=32))
  c.seq_len = 512
  c.batch_size = 32
  c.steps = 3000
  c.lr = 1e-3
  c.warmup = 100
  c.weight_decay = 0.01
  c.seed = 0
  c.train_tokens = 0
  c.eval_every = 500
  c.eval_prompts = 8
  c.eval_prompt_len = 128
  c.eval_k = 7
  c.eval_new_tokens = 64
  c.ckpt_every = 1000
  c.log_every = 50
  return c
