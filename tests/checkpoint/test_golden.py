"""Parity with HF transformers on checkpoints it saved (tests/fixtures/golden/make_golden.py)."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from tests.helpers import GOLDEN

# Every folder is a fixture but Python's caches (running make_golden.py leaves __pycache__).
FIXTURES = sorted(
  d for d in os.listdir(GOLDEN) if os.path.isdir(os.path.join(GOLDEN, d)) and not d.startswith("__")
)
# bf16 (8 mantissa bits, weights and activations rounded) against the float32 reference, relative
# to the spread of the logits: mean |error| <= 2.5% of their std, max |error| <= 20% (measured on
# these fixtures: mean 1.0-1.7%, max 7-14%).
BF16_MEAN_TOL, BF16_MAX_TOL = 0.025, 0.20


def _ref(name):
  return np.load(os.path.join(GOLDEN, name, "reference.npz"))


def _meta(name):
  with open(os.path.join(GOLDEN, name, "meta.json")) as f:
    return json.load(f)


def test_fixtures_cover_the_required_configs():
  assert len(FIXTURES) >= 3
  configs = [specdec.load(os.path.join(GOLDEN, n), dtype=jnp.float32).config for n in FIXTURES]
  assert any(c.num_groups > 1 for c in configs)
  assert any(c.tie_word_embeddings for c in configs)
  assert any(c.head_dim != c.hidden_size // c.num_heads for c in configs)
  assert any(c.model_type == "llama" and c.attention_bias for c in configs)
  assert any(
    os.path.exists(os.path.join(GOLDEN, n, "model.safetensors.index.json")) for n in FIXTURES
  )


@pytest.mark.parametrize("name", FIXTURES)
def test_float32_logits_match_reference(name):
  model = specdec.load(os.path.join(GOLDEN, name), dtype=jnp.float32)
  ref = _ref(name)
  logits = np.asarray(model.logits(ref["input_ids"]))
  assert logits.shape == ref["logits"].shape
  assert np.abs(logits - ref["logits"]).max() <= 1e-4


@pytest.mark.parametrize("name", FIXTURES)
def test_greedy_continuation_is_token_identical(name):
  model = specdec.load(os.path.join(GOLDEN, name), dtype=jnp.float32)
  ref = _ref(name)
  n = ref["greedy"].shape[1]
  out = specdec.generate(model, ref["prompt"].tolist(), max_new_tokens=n)
  assert out.tokens[0] == ref["greedy"][0].tolist()


@pytest.mark.parametrize("name", FIXTURES)
def test_bfloat16_logits_within_stated_tolerance(name):
  model = specdec.load(os.path.join(GOLDEN, name), dtype=jnp.bfloat16)
  ref = _ref(name)
  logits = np.asarray(model.logits(ref["input_ids"]))
  diff = np.abs(logits - ref["logits"])
  std = _meta(name)["logits_std"]
  assert diff.mean() <= BF16_MEAN_TOL * std and diff.max() <= BF16_MAX_TOL * std
  err = diff.max()
  # bf16 keeps the argmax wherever the reference's top-2 gap is clear of that error.
  top2 = np.sort(ref["logits"], -1)
  clear = (top2[..., -1] - top2[..., -2]) > 2 * err
  assert (logits.argmax(-1) == ref["logits"].argmax(-1))[clear].all()
