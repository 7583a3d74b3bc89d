"""The zoo's DFlash block drafter, b = 8, by the DFlash paper's recipe scaled to a 12-layer target:
5 taps uniformly from the second layer to the third-to-last (1, 3, 5, 7, 9), their features
injected into every draft layer's K/V, non-causal within the block, the target's embedding and LM
head frozen, loss weight exp(-(k-1)/gamma), random anchors. Draft layers: 2, the paper's 5-layer
draft of a 36-layer Qwen3-8B (14% of its layers) scaled to this target (docs/zoo.md). Trained on
the target's own continuations (the zoo build sets train_file), so a block's labels are the
target's greedy picks along its own path."""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "block"
  c.target = "zoo:target"
  c.dtype = "bfloat16"
  c.drafter = ml_collections.ConfigDict(
    dict(
      num_layers=2,
      block_size=8,
      target_layer_ids=(1, 3, 5, 7, 9),
      mask_token_id=1,  # <|pad|>: never emitted by the target
    )
  )
  c.loss = ml_collections.ConfigDict(dict(anchors=32))
  c.train_file = "train.npy"  # in the corpus dir (or a path: the zoo build's self-distilled stream)
  c.seq_len = 1024
  c.batch_size = 32
  c.steps = 6000
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
