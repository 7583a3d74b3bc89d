"""MTP drafter: causality, rollback by length, the greedy gate, a head trained in the test, layouts.

The toy world (shared with test_eagle3.py): arithmetic progressions mod 48 with a step in {1, 2,
3} drawn per row, written through a fixed injection into the 64-token vocabulary. A 2-layer target
learns it in a few hundred steps; a head that learns it too drafts the continuation.
"""

import dataclasses
import functools
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.checkpoint.safetensors_io import read_tensors, write_tensors
from specdec.decoding.generate import cache_slots
from specdec.decoding.step import StepConfig, decode_chunk, prefill
from specdec.drafters.base import Context
from specdec.drafters.mtp import MTPConfig, load_mtp, mtp, save_mtp
from specdec.model import Model, forward
from specdec.ops.sampling import Sampling
from specdec.training import adamw, fit, lm
from specdec.training import mtp as mtp_train
from tests.helpers import tiny_config

MODULUS, STEPS = 48, (1, 2, 3)
LABELS = np.random.default_rng(7).permutation(64)[:MODULUS]  # residue -> token id
PROMPT_LENGTHS = (5, 9, 14)  # rows of different lengths
# (batch, k) of the greedy-identity check: every batch and every k, not every pair; (3, 4) is the
# step the other tests of a head decode with anyway.
IDENTITY_CASES = ((1, 1), (3, 4), (3, 8))
MAX_NEW, BUCKET = 24, 16  # every prompt here fits generate's smallest bucket


def toy_rows(rng, B, T):
  a_B1 = rng.integers(MODULUS, size=(B, 1))
  d_B1 = rng.choice(STEPS, size=(B, 1))
  return LABELS[(a_B1 + d_B1 * np.arange(T)) % MODULUS].astype(np.int32)


def toy_batches(seed, B=16, T=32):
  rng = np.random.default_rng(seed)
  while True:
    yield toy_rows(rng, B, T)


def toy_prompts(seed=5):
  rng = np.random.default_rng(seed)
  return [toy_rows(rng, 1, n)[0].tolist() for n in PROMPT_LENGTHS]


def train(loss_fn, params, steps, lr, seed, frozen=None):
  opt = adamw(lr, steps=steps, warmup=steps // 10)
  params, _ = fit(
    loss_fn, params, toy_batches(seed), optimizer=opt, steps=steps, frozen=frozen, progress=False
  )
  return params


def toy_target(num_layers: int = 2) -> Model:
  c = tiny_config(num_hidden_layers=num_layers)
  init = jax.jit(lm.init_params, static_argnums=(0, 1))  # one compile, not one per shape
  params = train(lm.make_loss(c, jnp.float32), init(c, 0), steps=150, lr=3e-2, seed=0)
  return Model(c, params, dtype=jnp.float32)


def generate(target, prompts, drafter=None, k=None):
  return specdec.generate(target, prompts, max_new_tokens=MAX_NEW, drafter=drafter, k=k)


@functools.partial(jax.jit, static_argnames=("drafter", "config"))
def head_logits(target_params, drafter_params, tokens_BT, drafter, config):
  """Every pair's draft logits over a whole sequence, as training sees them."""
  out = forward(target_params, tokens_BT, config, drafter.dtype, drafter.taps)
  h_BTD = drafter.features(drafter_params, out)
  out_BTD, _ = drafter.teacher_forced(drafter_params, h_BTD, tokens_BT)
  return drafter.logits(drafter_params, out_BTD)


def check_causal(target, drafter):
  """Pair p sees target features <= p and tokens <= p+1: changing tokens from j on leaves pairs
  < j-1 alone (and does change pair j-1)."""
  tokens = np.random.default_rng(0).integers(64, size=(2, 24)).astype(np.int32)
  changed = tokens.copy()
  changed[:, 10:] = (changed[:, 10:] + 1) % 64
  a = head_logits(target.params, drafter.params, tokens, drafter, target.config)
  b = head_logits(target.params, drafter.params, changed, drafter, target.config)
  np.testing.assert_allclose(a[:, :9], b[:, :9], rtol=1e-5, atol=1e-5)
  assert not np.allclose(a[:, 9], b[:, 9], atol=1e-3)


propose_jit = jax.jit(
  lambda d, params, state, ctx, k, sampling, key: d.propose(params, state, ctx, k, sampling, key),
  static_argnums=(0, 4, 5),
)


def start(target, drafter, prompts, k, pad=0):
  """The state after the target's prefill, exactly as `generate` builds it (so the compiled
  prefill and step are shared with it), except that the prompt padding is `pad`."""
  sc = StepConfig(target.config, target.dtype, drafter, k, Sampling(), "greedy", ())
  prompt_BT = np.full((len(prompts), BUCKET), pad, np.int32)
  for i, p in enumerate(prompts):
    prompt_BT[i, : len(p)] = p
  lengths_B = jnp.asarray([len(p) for p in prompts], jnp.int32)
  max_new_B = jnp.full((len(prompts),), MAX_NEW, jnp.int32)
  slots = cache_slots(BUCKET, MAX_NEW, k)
  args = (jnp.asarray(prompt_BT), lengths_B, max_new_B, jax.random.key(0), sc, slots)
  return prefill(target.params, drafter.params, *args), sc


def drafts(drafter, st, k):
  ctx = Context(st.tokens, st.lengths)
  d_BJ, _, _ = propose_jit(drafter, drafter.params, st.draft, ctx, k, Sampling(), jax.random.key(1))
  return np.asarray(d_BJ)


def check_padding_ignored(target, drafter, k=4):
  """Stale slots past the prompt (the bucket padding) never reach the drafts."""
  prompts = toy_prompts()
  a = drafts(drafter, start(target, drafter, prompts, k, pad=0)[0], k)
  b = drafts(drafter, start(target, drafter, prompts, k, pad=7)[0], k)
  np.testing.assert_array_equal(a, b)


def check_sampled_q(target, drafter):
  """One temperature-1 proposal of 4 drafts for the toy prompts: its q is a distribution over the
  whole vocabulary at every draft. Returns the drafts d_BJ and q_BJV."""
  st, _ = start(target, drafter, toy_prompts(), k=4)
  ctx = Context(st.tokens, st.lengths)
  d_BJ, q_BJV, _ = propose_jit(
    drafter, drafter.params, st.draft, ctx, 4, Sampling(1.0), jax.random.key(2)
  )
  q_BJV = np.asarray(q_BJV)
  assert q_BJV.shape == (3, 4, 64)
  np.testing.assert_allclose(q_BJV.sum(-1), 1.0, atol=1e-5)
  return np.asarray(d_BJ), q_BJV


def check_rollback(target, drafter, k=4, n_steps=2):
  """After steps with accepted and rejected drafts, the head's cache equals, on every slot it
  may attend to, that of a fresh prefill of the committed text, and it drafts the same tokens:
  rollback by length left nothing stale in view."""
  rng = np.random.default_rng(11)
  # A toy row (drafts accepted) and rows of random tokens (drafts rejected early).
  prompts = [toy_rows(rng, 1, 4)[0].tolist(), [3, 50, 17], [60, 1, 22, 9, 41]]
  st, sc = start(target, drafter, prompts, k)
  for _ in range(n_steps):
    st = decode_chunk(target.params, drafter.params, st, sc, 1)
  assert 0 < int(st.accepted.sum()) < int(st.proposed.sum())
  tokens, lengths = np.asarray(st.tokens), np.asarray(st.lengths)
  committed = [tokens[b, : lengths[b] - 1].tolist() for b in range(len(prompts))]
  fresh, _ = start(target, drafter, committed, k)
  np.testing.assert_array_equal(np.asarray(fresh.lengths), lengths)
  rows = np.arange(len(prompts))
  np.testing.assert_array_equal(
    np.asarray(fresh.tokens)[rows, lengths - 1], tokens[rows, lengths - 1]
  )
  for a_BSKH, b_BSKH in zip(
    st.draft.cache.k + st.draft.cache.v, fresh.draft.cache.k + fresh.draft.cache.v, strict=True
  ):
    for b, n in enumerate(lengths - 2):  # pairs < L-2 are the ones both states hold
      np.testing.assert_allclose(a_BSKH[b, :n], b_BSKH[b, :n], atol=1e-5)
  np.testing.assert_array_equal(drafts(drafter, st, k), drafts(drafter, fresh, k))


def baselines(target):
  return {B: generate(target, toy_prompts()[:B]).tokens for B in (1, 3)}


def check_greedy_identity(target, drafter, baseline):
  for B, k in IDENTITY_CASES:
    out = generate(target, toy_prompts()[:B], drafter, k)
    assert out.tokens == baseline[B], (B, k)
    assert sum(out.stats["rows"]["proposed"]) == k * sum(out.stats["rows"]["steps"])


# What every trained head of the toy world passes, each called (target, drafter, baseline); one
# parametrized test runs them here and one in test_eagle3.py.
TRAINED_HEAD_CHECKS = {
  "prompt_padding_does_not_leak": lambda target, drafter, _: check_padding_ignored(target, drafter),
  "rollback_matches_fresh_prefill": lambda target, drafter, _: check_rollback(target, drafter),
  "greedy_identity": check_greedy_identity,
}


@pytest.fixture(scope="module")
def target():
  return toy_target()


@pytest.fixture(scope="module")
def baseline(target):
  return baselines(target)


def _trained(target, config, steps):
  cfg = mtp_train.MTPTrainConfig(mtp=config)
  params = mtp_train.init_params(target, cfg, jax.random.key(1))
  loss_fn = mtp_train.make_loss(target, cfg)
  params = train(loss_fn, params, steps, 1e-2, seed=1, frozen=mtp_train.frozen_params(target))
  return mtp_train.drafter(target, params, cfg)


@pytest.fixture(scope="module")
def qwen_head(target):
  return _trained(target, MTPConfig(), steps=120)


@pytest.fixture(scope="module")
def deepseek_head(target):
  return _trained(target, MTPConfig.deepseek_v3(), steps=100)


@pytest.fixture(scope="module")
def untrained_tau(target, qwen_head):
  # Equal configuration, other weights: the compiled step of the trained head is reused.
  untrained = dataclasses.replace(qwen_head, weights=mtp(target, seed=5).weights)
  return generate(target, toy_prompts(), untrained, k=4).stats["tau"]


def test_target_learned_the_toy_world(target, baseline):
  prompts = toy_prompts()
  residue_of = np.full(64, -1)
  residue_of[LABELS] = np.arange(MODULUS)
  for p, out in zip(prompts, baseline[3], strict=True):
    residues = residue_of[np.asarray(p + out)]
    assert np.all(np.diff(residues) % MODULUS == (residues[1] - residues[0]) % MODULUS)


def test_head_is_causal(target):
  check_causal(target, mtp(target, seed=3))


@pytest.mark.parametrize("check", TRAINED_HEAD_CHECKS.values(), ids=list(TRAINED_HEAD_CHECKS))
def test_trained_head_checks(target, baseline, qwen_head, check):
  check(target, qwen_head, baseline)


def test_greedy_identity_deepseek_variant(target, baseline, deepseek_head):
  assert deepseek_head.taps == (target.config.num_layers - 1,)  # reads the pre-norm stream
  out = generate(target, toy_prompts(), deepseek_head, k=4)
  assert out.tokens == baseline[3]


@pytest.mark.parametrize("head", ["qwen_head", "deepseek_head"])
def test_trained_head_drafts_the_continuation(target, head, request, untrained_tau):
  trained = generate(target, toy_prompts(), request.getfixturevalue(head), k=4)
  assert trained.stats["tau"] >= 1.5, trained.stats["tau"]
  assert untrained_tau < 1.3, untrained_tau  # the bar needs learning


def test_shares_the_targets_embedding_and_head(target, qwen_head):
  shared, own = qwen_head.weights["target"]["params"], target.params["params"]
  assert shared["embed"]["embedding"] is own["embed"]["embedding"]
  assert shared["lm_head"]["kernel"] is own["lm_head"]["kernel"]


def test_fullq_drafts_are_samples_of_q(target, qwen_head):
  d_BJ, q_BJV = check_sampled_q(target, qwen_head)
  assert np.all(np.take_along_axis(q_BJV, d_BJ[..., None], -1) > 0)


# --- Layouts ----------------------------------------------------------------------------------

LAYOUT_NAMES = {
  "qwen3_next": (
    "mtp.fc.weight",
    "mtp.pre_fc_norm_embedding.weight",
    "mtp.pre_fc_norm_hidden.weight",
    "mtp.norm.weight",
    "mtp.layers.0.self_attn.q_proj.weight",
    "mtp.layers.0.input_layernorm.weight",
    "mtp.layers.0.mlp.down_proj.weight",
  ),
  "deepseek_v3": (
    "model.layers.2.eh_proj.weight",
    "model.layers.2.enorm.weight",
    "model.layers.2.hnorm.weight",
    "model.layers.2.shared_head.norm.weight",
    "model.layers.2.self_attn.k_proj.weight",
    "model.layers.2.post_attention_layernorm.weight",
  ),
}


@pytest.mark.parametrize("head", ["qwen_head", "deepseek_head"])
def test_layout_round_trip(target, head, request, tmp_path):
  drafter = request.getfixturevalue(head)
  save_mtp(str(tmp_path), drafter)
  tensors = read_tensors(str(tmp_path / "model.safetensors"))
  assert set(LAYOUT_NAMES[drafter.spec.layout]) <= set(tensors)
  if drafter.spec.layout == "qwen3_next":  # stored zero-centred: the layer computes x * (1 + w)
    scale = drafter.weights["head"]["params"]["norm"]["scale"]
    np.testing.assert_allclose(tensors["mtp.norm.weight"], np.asarray(scale) - 1, atol=1e-6)
  back = load_mtp(str(tmp_path), target)  # the layout is detected from the tensor names
  assert (back.spec, back.taps, back.head_config) == (drafter.spec, drafter.taps, target.config)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), drafter.weights, back.weights
  )
  prompts = toy_prompts()
  assert generate(target, prompts, back, 4).tokens == generate(target, prompts, drafter, 4).tokens


def _corrupt(src, dst, edit):
  tensors = read_tensors(os.path.join(src, "model.safetensors"))
  edit(tensors)
  os.makedirs(dst, exist_ok=True)
  write_tensors(os.path.join(dst, "model.safetensors"), tensors)
  with open(os.path.join(src, "config.json")) as f:
    return json.load(f)


def test_bad_checkpoints_name_the_tensor(target, qwen_head, tmp_path):
  good = str(tmp_path / "good")
  save_mtp(good, qwen_head)
  cases = {
    "mtp.fc.weight": lambda t: t.pop("mtp.fc.weight"),
    "'mtp.layers.0.self_attn.q_proj.weight' has shape": lambda t: t.update(
      {"mtp.layers.0.self_attn.q_proj.weight": np.zeros((64, 40), np.float32)}
    ),
    "unexpected tensor 'mtp.layers.1.mlp.up_proj.weight'": lambda t: t.update(
      {"mtp.layers.1.mlp.up_proj.weight": np.zeros((96, 48), np.float32)}
    ),
  }
  for i, (message, edit) in enumerate(cases.items()):
    bad = str(tmp_path / f"bad{i}")
    config = _corrupt(good, bad, edit)
    with open(os.path.join(bad, "config.json"), "w") as f:
      json.dump(config, f)
    with pytest.raises(ValueError, match=re.escape(message)):
      load_mtp(bad, target)
  with pytest.raises(ValueError, match=re.escape("missing tensor 'model.layers.2.eh_proj.weight'")):
    load_mtp(good, target, MTPConfig.deepseek_v3())
  none = str(tmp_path / "none")
  _corrupt(good, none, lambda t: (t.clear(), t.update(x=np.zeros(1, np.float32))))
  with pytest.raises(ValueError, match="no MTP head"):
    load_mtp(none, target)
  with open(os.path.join(good, "config.json")) as f:
    config = json.load(f)
  config["num_nextn_predict_layers"] = 2
  with open(os.path.join(good, "config.json"), "w") as f:
    json.dump(config, f)
  with pytest.raises(ValueError, match="2 MTP layers"):
    load_mtp(good, target)
