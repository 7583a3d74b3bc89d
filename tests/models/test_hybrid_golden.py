"""Parity with HF transformers' Qwen3-Next, Qwen3.5 (text models and vision-language wrappers) and
Qwen3-MoE (tests/fixtures/hybrid/make_hybrid.py)."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import specdec

HYBRID = "tests/fixtures/hybrid"
FIXTURES = sorted(
  d for d in os.listdir(HYBRID) if os.path.isdir(os.path.join(HYBRID, d)) and not d.startswith("__")
)
# A bfloat16 run against the float32 reference may err as much as HF's own bfloat16 run does
# (`hf_bfloat16_err` in meta.json), with this margin (measured: 0.9-1.25x mean, 0.9-1.25x max).
# The Gated DeltaNet stacks are far more sensitive to bf16 than attention alone.
BF16_MARGIN = 1.5


def _load(name, dtype=jnp.float32):
  return specdec.load(os.path.join(HYBRID, name), dtype=dtype)


def _ref(name):
  return np.load(os.path.join(HYBRID, name, "reference.npz"))


def test_fixtures_cover_dense_and_moe_hybrids_and_qwen3_moe():
  configs = {n: _load(n).config for n in FIXTURES}
  next_cfgs = [c for c in configs.values() if c.model_type == "qwen3_next"]
  assert any(not any(c.moe_layers) for c in next_cfgs)  # dense-MLP hybrid
  assert any(any(c.moe_layers) and not all(c.moe_layers) for c in next_cfgs)  # mixed, shared
  assert any(c.model_type == "qwen3_moe" and all(c.moe_layers) for c in configs.values())
  assert all(c.linear_layers and c.attention_layers for c in next_cfgs)


@pytest.mark.parametrize("name", FIXTURES)
def test_float32_logits_match_reference(name):
  ref = _ref(name)
  logits = np.asarray(_load(name).logits(ref["input_ids"]))
  assert logits.shape == ref["logits"].shape
  assert np.abs(logits - ref["logits"]).max() <= 1e-4


@pytest.mark.parametrize("name", FIXTURES)
def test_greedy_continuation_is_token_identical(name):
  # Prefill through the chunked form, then one recurrent step per token, each state settled.
  ref = _ref(name)
  n = ref["greedy"].shape[1]
  out = specdec.generate(_load(name), ref["prompt"].tolist(), max_new_tokens=n)
  assert out.tokens[0] == ref["greedy"][0].tolist()


@pytest.mark.parametrize("name", FIXTURES)
def test_bfloat16_logits_within_stated_tolerance(name):
  ref = _ref(name)
  logits = np.asarray(_load(name, jnp.bfloat16).logits(ref["input_ids"]))
  diff = np.abs(logits - ref["logits"])
  with open(os.path.join(HYBRID, name, "meta.json")) as f:
    hf = json.load(f)["hf_bfloat16_err"]
  assert diff.mean() <= BF16_MARGIN * hf["mean"] and diff.max() <= BF16_MARGIN * hf["max"]
