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
