"""The default sweep: the tiny zoo on a HumanEval subset, draft budget k for every drafter plus
the no-draft arm, greedy. Runs in a few minutes on a 2-core CPU."""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.target = "zoo:target"
  # Checkpointed drafters by method name (kind + suffix); `methods` picks which run.
  c.checkpoints = ml_collections.ConfigDict(
    {
      "draft_lm": "zoo:draft_lm",
      "mtp": "zoo:mtp",
      "eagle3": "zoo:eagle3",
      "block8": "zoo:block8",
      "block16": "zoo:block16",
    }
  )
  c.dtype = "float32"  # CPU default; bfloat16 on GPU
  c.workload = "humaneval"
  c.chat_template = False  # True: prompts go through the target's chat template (raw otherwise)
  c.n_prompts = 3  # the first batch of each (cell, leg) is warm-up: >= 2 x max(batches)
  c.max_new_tokens = 48
  c.legs = 2
  c.seed = 0  # base: leg l, sample seed s, prompt i sample with seed + 10**6 s + 1000 l + i
  # Axes: the sweep runs their product (the no-draft arm always, at k = 0).
  c.methods = ("null", "ngram", "draft_lm", "mtp", "eagle3", "block8", "block16")
  c.ks = (1, 2, 4, 8, 12, 16)
  c.prompt_tokens = (0,)  # 0: prompts as they are; > 0: extended with real text to that length
  c.temperatures = (0.0,)
  c.top_ks = (0,)
  c.top_ps = (1.0,)
  c.acceptances = ("auto",)  # greedy at T = 0, onehot when sampling
  c.target_formats = ("bf16",)
  c.kv_dtypes = ("model",)
  c.batches = (1,)
  c.seeds = (0,)  # sampling seeds, an axis of sampled cells (greedy cells run the first only)
  c.ngram = ml_collections.ConfigDict({"min_n": 1, "max_n": 4})
  # Share of the device's memory the params + decode state may fill (vLLM's
  # gpu_memory_utilization); a cell that does not fit is refused before the sweep starts.
  c.memory_fraction = 0.9
  # q/k/v and gate/up as one matmul each in the decoding target (specdec.models.fuse: same logits,
  # a faster step on the H200: docs/benchmarks.md).
  c.fuse_projections = True
  return c
