"""The default sweep: the tiny zoo continuing long real source files (jax's, which it never trained
on), draft budget k x context length for every drafter plus the no-draft arm, greedy; beside it
the zoo's hybrid target (Qwen3-Next) with its MTP head at one context. Runs in under 5 minutes
on a 2-core CPU."""

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
      "dflash2": "zoo:dflash2",
      "dspark": "zoo:dspark",
      "hybrid_mtp": "zoo:hybrid_mtp",
    }
  )
  c.dtype = "float32"  # CPU default; bfloat16 on GPU
  # Workloads, an axis: "humaneval", "jax_source" (documents: a prompt is a source file's first
  # prompt_tokens tokens), "edit_loop" (the last turn of a repetitive edit loop over a window of
  # each source file, earlier turns answered by the target: configs/suffix.py), or a prompt file
  # (JSONL of {"prompt": ...}, MT-Bench {"turns": [...]} run turn by turn, ShareGPT); see
  # specdec/data/workload.py.
  c.workloads = ("jax_source",)
  # True: prompts go through the target's chat template (raw otherwise; documents always raw)
  c.chat_template = False
  # The first batch of each (cell, leg) is warm-up: >= 2 x max(batches). 2 prompts x 32 tokens and
  # 3 values of k keep the CPU run of nine methods under 5 minutes.
  c.n_prompts = 2
  c.max_new_tokens = 32
  c.legs = 2
  c.seed = 0  # base: leg l, sample seed s, prompt i sample with seed + 10**6 s + 1000 l + i
  # Axes: the sweep runs their product (the no-draft arm always, at k = 0).
  # "suffix" (suffix decoding) runs in configs/suffix.py, on the workload it is built for: in
  # this sweep it took 5 min 44 s on a 2-core CPU, past the 5 minutes (docs/benchmarks.md).
  c.methods = (
    "null",
    "ngram",
    "draft_lm",
    "mtp",
    "eagle3",
    "block8",
    "block16",
    "dflash2",
    "dspark",
    "hybrid_mtp",
  )
  # A method's own settings where they are not the sweep's (PER_METHOD of specdec/lab/sweep.py):
  # the target it drafts for (that target's no-draft arm runs beside it, at its prompt lengths),
  # its ks and prompt_tokens. The hybrid target's MTP head (issue 25) runs on the hybrid at one
  # context and two k: the fewest cells that show the family within the 5 minutes.
  c.per_method = ml_collections.ConfigDict(
    {"hybrid_mtp": {"target": "zoo:hybrid", "ks": (2, 4), "prompt_tokens": (512,)}}
  )
  c.ks = (1, 2, 4)
  # Static draft trees, beside the chains of ks, for every method that drafts trees (a method
  # that cannot is refused by name): presets of specdec/lab/trees.py or tuples of paths such as
  # ((0,), (1,), (0, 0)), or "auto": tree="auto" among config.budget_tree_tiers (presets or
  # paths, nested; default the library's binary trees of 2, 4, 8, 16 nodes); none here
  # (configs/trees.py sweeps them).
  c.trees = ()
  # Context lengths within the zoo target's 4096 positions (prompt + max_new_tokens + k + 1 fit).
  # 1024 at most here: a prompt is padded to a power-of-two bucket and a CPU prefill grows ~T^2
  # (1024 tokens 0.44 s, 2048 2.2 s, 4000 9.5 s on a 2-core CPU): with k in {2, 4}, contexts
  # {128, 512, 1536} (a 2048 bucket) took this sweep to 5 min 14 s.
  # `--config.prompt_tokens='(128,1024,4000)'` reaches the limit.
  # 0: prompts as they are; > 0: documents cut, other prompts extended with real text, to it.
  c.prompt_tokens = (128, 512, 1024)
  c.temperatures = (0.0,)
  c.top_ks = (0,)
  c.top_ps = (1.0,)
  c.acceptances = ("auto",)  # greedy at T = 0, onehot when sampling
  c.target_formats = ("bf16",)
  c.kv_dtypes = ("model",)
  c.batches = (1,)
  c.seeds = (0,)  # sampling seeds, an axis of sampled cells (greedy cells run the first only)
  c.ngram = ml_collections.ConfigDict({"min_n": 1, "max_n": 4})
  # Suffix decoding (specdec/drafters/suffix.py): arctic-inference's options as vLLM defaults them;
  # the store of earlier outputs stays empty in a sweep (memory across legs), so it is small.
  c.suffix = ml_collections.ConfigDict(
    {
      "max_depth": 24,
      "max_spec_factor": 1.0,
      "max_spec_offset": 0.0,
      "min_token_prob": 0.1,
      "store_size": 256,
      "max_tree_tokens": 0,  # tree cells: the most nodes kept per step (0: the whole tree)
    }
  )
  # Share of the device's memory the params + decode state may fill (vLLM's
  # gpu_memory_utilization); a cell that does not fit is refused before the sweep starts.
  c.memory_fraction = 0.9
  # q/k/v and gate/up as one matmul each in the decoding target (specdec.models.fuse: same logits,
  # a faster step on the H200: docs/benchmarks.md).
  c.fuse_projections = True
  # > 1: the target tensor-parallel over that many local devices (specdec.sharding; bf16 targets,
  # unfused projections, drafters replicated).
  c.tensor_parallel = 1
  # > 1: cells spread over that many local devices, each holding its own copy of the models (one
  # thread per device; a cell runs beside its no-draft arm on one device).
  c.devices = 1
  return c
