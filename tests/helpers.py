"""Small shared builders for tests."""

from specdec.model import Model
from specdec.models.config import from_hf_dict

GOLDEN = "tests/fixtures/golden"


def tiny_config(**kw):
  d = dict(
    model_type="qwen3",
    vocab_size=64,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
  )
  d.update(kw)
  return from_hf_dict(d)


def tiny_model(seed=0, scale=10.0, **kw) -> Model:
  """Random weights scaled up so argmax gaps are wide and greedy text is not a constant."""
  return Model.random(tiny_config(**kw), seed=seed, scale=scale)


def result_row(**over):
  """A complete, valid sweep result row (specdec.results schema) with `over` applied."""
  row = {
    "method": "ngram",
    "k": 2,
    "workload": "humaneval",
    "prompt_tokens": 512,
    "ctx_bucket": "[512,1024)",
    "temperature": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "acceptance": "greedy",
    "target_format": "bf16",
    "kv_dtype": "bfloat16",
    "batch": 1,
    "seed": 0,
    "leg": 0,
    "device": "cpu",
    "jax_version": "0.11.2",
    "git_commit": "unknown",
    "timestamp": "2026-12-01T00:00:00+00:00",
    "gate_passed": True,
  }
  row.update(over)
  return row
