"""Distilling a student LM into a frozen teacher's soft distribution (specdec.training.lm)."""

import jax.numpy as jnp
import numpy as np
import pytest

from specdec.model import Model
from specdec.training import data, lm, loop
from tests.helpers import tiny_config

V = 64


def peaked_teacher(config, seed=7, head_scale=40.0):
  """A random teacher that is mostly a sharp bigram model: a large LM head makes the logits a
  peaked function of the current token (the residual stream at init is mostly its embedding),
  which a student learns in a few dozen steps, where a function of random contexts it could not."""
  params = lm.init_params(config, seed)
  head = params["params"]["lm_head"]
  params["params"]["lm_head"] = {"kernel": head["kernel"] * head_scale}
  return Model(config, params, dtype=jnp.float32)


def test_distillation_pulls_the_student_to_the_teacher():
  teacher = peaked_teacher(tiny_config(vocab_size=V))
  student_config = tiny_config(vocab_size=V, hidden_size=32, num_hidden_layers=1)
  rng = np.random.default_rng(0)
  batches = data.TokenWindows(rng.integers(0, V, 20_000).astype(np.uint16), 8, 16, seed=0)
  held = data.HeldOut(rng.integers(0, V, 1_000).astype(np.uint16), 8, 16)
  evaluate = lm.make_eval(student_config, jnp.float32, held, teacher, alpha=1.0)
  params = lm.init_params(student_config, seed=0)
  before = evaluate(params)
  params, h = loop.fit(
    lm.make_loss(student_config, jnp.float32, teacher, alpha=1.0),
    params,
    batches,
    optimizer=loop.adamw(3e-3, steps=60, warmup=5),
    steps=60,
    frozen=teacher.params,
    log_every=10,
    progress=False,
  )
  after = evaluate(params)
  assert after["heldout_kl"] < 0.7 * before["heldout_kl"], (before, after)
  assert after["heldout_agree"] > before["heldout_agree"] + 0.1
  assert after["heldout_loss"] == pytest.approx(after["heldout_kl"])  # alpha = 1: pure KL
  assert {"kl", "agree", "ce", "acc"} <= set(h["train"][-1])


def test_alpha_mixes_kl_and_cross_entropy_and_temperature_scales_kl():
  config = tiny_config(vocab_size=V)
  teacher = peaked_teacher(config)
  params = lm.init_params(config, seed=1)
  tokens_BT = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, 16)), jnp.int32)

  def loss(alpha, temperature=1.0):
    fn = lm.make_loss(config, jnp.float32, teacher, alpha=alpha, temperature=temperature)
    return fn(params, teacher.params, tokens_BT, None)

  (kl_only, m), (ce_only, _), (mixed, _) = loss(1.0), loss(0.0), loss(0.25)
  assert float(kl_only) == pytest.approx(float(m["kl"]), rel=1e-6)
  assert float(ce_only) == pytest.approx(float(m["ce"]), rel=1e-6)
  assert float(mixed) == pytest.approx(0.25 * float(m["kl"]) + 0.75 * float(m["ce"]), rel=1e-5)
  # A student equal to its teacher has zero KL at any temperature.
  same, _ = lm.make_loss(config, jnp.float32, teacher, temperature=2.0)(
    teacher.params, teacher.params, tokens_BT, None
  )
  assert abs(float(same)) < 1e-5
