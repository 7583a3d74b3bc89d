"""Peers on one machine (experiments/bench_peers.py): HF transformers against specdec, same
weights and prompts, interleaved legs. Sized for one H200; on a CPU, shrink `shape.model` (the
test does) and point `torch_python` at an interpreter with torch + transformers."""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  # shape: plain greedy at an 8B shape, transformers static cache + compile vs specdec.
  # zoo: HF assisted generation and prompt lookup vs specdec's draft_lm and ngram on the zoo pair.
  c.parts = ("shape", "zoo")
  c.legs = 2  # arms interleaved A, B, A, B; request 0 of each leg is warm-up
  c.seed = 0
  c.dtype = "bfloat16"  # both frameworks, weights and compute
  c.torch_python = ""  # interpreter of the transformers worker; "" = this one
  c.torch_device = "auto"  # the worker's torch device: cuda when it has one
  c.shape = ml_collections.ConfigDict(
    {
      # Qwen3-8B (HF config keys); random weights, no EOS, so every request decodes its budget.
      "model": {
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
      },
      "prompt_tokens": 1024,  # one fixed length: transformers' static cache compiles per size
      "max_new_tokens": 256,
      "n_requests": 4,  # per leg, request 0 included
      "weight_exp": 12,  # hashed weights are multiples of 2**-12 in [-1/32, 1/32)
      "bar": 1.2,  # issue 9: specdec >= 1.2x transformers static + compile, decode-only
    }
  )
  c.zoo = ml_collections.ConfigDict(
    {
      "target": "zoo:target",
      "draft": "zoo:draft_lm",
      "n_prompts": 9,  # the first HumanEval prompts, right-stripped; request 0 is warm-up
      "max_new_tokens": 128,
      "k": 4,  # drafts per target forward, both frameworks (HF: constant schedule)
      "ngram": {"min_n": 1, "max_n": 4},  # HF prompt lookup gets max_matching_ngram_size=max_n
      "bar": 2.0,  # issue 9: specdec draft_lm >= 2x HF assisted generation, decode-only
    }
  )
  return c
