"""EAGLE-3 drafter: the published layout against an independent numpy reference, causality,
rollback by length, the greedy gate, a head trained in the test, export round trip, bad
checkpoints. The toy world and the shared checks live in test_mtp.py."""

import dataclasses
import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.checkpoint.safetensors_io import read_tensors, write_tensors
from specdec.drafters.eagle3 import draft_vocab_from_tokens, eagle3, load_eagle3, save_eagle3
from specdec.models.transformer import KVCache
from specdec.training import eagle3 as eagle3_train
from specdec.training.mtp import ChainTraining
from tests.drafters.test_mtp import (
  LABELS,
  TRAINED_HEAD_CHECKS,
  baselines,
  check_causal,
  check_sampled_q,
  generate,
  toy_batches,
  toy_prompts,
  toy_target,
  train,
)

FIXTURE = "tests/fixtures/eagle3/tiny"
CFG = eagle3_train.Eagle3TrainConfig(
  draft_vocab_size=48, aux_layer_ids=(1, 2, 3), chain=ChainTraining(depth=3, origins=8)
)


@pytest.fixture(scope="module")
def target():
  return toy_target(num_layers=3)  # EAGLE-3 fuses three distinct taps


baseline = pytest.fixture(baselines, scope="module")


@pytest.fixture(scope="module")
def draft_ids():
  # The toy corpus uses 48 of the 64 ids: the reduced vocabulary is exactly those, with a
  # non-trivial d2t.
  ids = draft_vocab_from_tokens(next(toy_batches(3)), 48, 64)
  assert ids.tolist() == sorted(LABELS.tolist())
  return ids


@pytest.fixture(scope="module")
def head(target, draft_ids):
  params = eagle3_train.init_params(target, CFG, jax.random.key(1))
  loss_fn = eagle3_train.make_loss(target, CFG)
  frozen = eagle3_train.frozen_params(target, draft_ids)
  params = train(loss_fn, params, steps=120, lr=1e-2, seed=1, frozen=frozen)
  return eagle3_train.drafter(target, params, CFG, draft_ids)


def _reference_pass(weights, taps_TX, tokens_T, chain_token, drafter):
  """Pairs 0..T-1 from an empty cache, then one chained step at position T."""
  T = tokens_T.shape[0]
  h_BTD = drafter.module.apply(weights["head"], taps_TX[None], method="fuse")
  cache = KVCache.zeros(drafter.head_config, 1, T + 1, jnp.float32)
  positions_BT = jnp.arange(T)[None]
  out_BTD, cache = drafter.forward(weights, h_BTD, tokens_T[None], positions_BT, cache)
  chain_B1D, _ = drafter.forward(
    weights, out_BTD[:, -1:], chain_token.reshape(1, 1), positions_BT[:, -1:] + 1, cache
  )
  return drafter.logits(weights, out_BTD)[0], drafter.logits(weights, chain_B1D)[0, 0]


def test_fixture_matches_numpy_reference(target):
  """The published tensor names, the [embedding, hidden] order, the residual from the fused
  taps, fc on target features only, norm placement and d2t, against EAGLE's semantics written
  independently in numpy (make_fixture.py)."""
  d = load_eagle3(FIXTURE, target)
  assert d.taps == (0, 1, 2) and d.own_embed and d.spec.head.intermediate_size == 80
  ref = np.load(os.path.join(FIXTURE, "reference.npz"))
  logits, chain_logits = jax.jit(_reference_pass, static_argnums=4)(
    d.weights, ref["taps"], ref["tokens"], ref["chain_token"], d
  )
  np.testing.assert_allclose(logits, ref["logits"], atol=1e-4)
  np.testing.assert_allclose(chain_logits, ref["chain_logits"], atol=1e-4)


def test_head_is_causal(target, draft_ids):
  check_causal(
    target, eagle3(target, config=eagle3_train.head_config(target, CFG), draft_ids=draft_ids)
  )


@pytest.mark.parametrize("check", TRAINED_HEAD_CHECKS.values(), ids=list(TRAINED_HEAD_CHECKS))
def test_trained_head_checks(target, baseline, head, check):
  check(target, head, baseline)


def test_trained_head_drafts_the_continuation(target, head):
  trained = generate(target, toy_prompts(), head, k=4)
  # Equal configuration, untrained weights: the compiled step of the trained head is reused.
  untrained = dataclasses.replace(
    head, weights=eagle3(target, config=head.spec, draft_ids=head.weights["draft_ids"]).weights
  )
  # >= 3: drafts past the first are accepted too, which takes the training-time test (trained
  # on the first draft only, this head's tau is 2.0: the second draft is never right).
  assert trained.stats["tau"] >= 3.0, trained.stats["tau"]
  untrained_tau = generate(target, toy_prompts(), untrained, k=4).stats["tau"]
  assert untrained_tau < 1.3, untrained_tau  # the bar needs learning


def test_fullq_q_lives_on_the_draft_vocabulary(target, head, draft_ids):
  d_BJ, q_BJV = check_sampled_q(target, head)
  outside = np.setdiff1d(np.arange(64), draft_ids)
  assert np.all(q_BJV[..., outside] == 0)
  assert np.isin(d_BJ, draft_ids).all()


def test_export_round_trip(target, head, tmp_path):
  save_eagle3(str(tmp_path), head)
  tensors = read_tensors(str(tmp_path / "model.safetensors"))
  assert tensors["fc.weight"].shape == (48, 3 * 48)
  assert tensors["midlayer.self_attn.q_proj.weight"].shape == (64, 2 * 48)
  assert tensors["lm_head.weight"].shape == (48, 48)
  ids = np.asarray(head.weights["draft_ids"])
  np.testing.assert_array_equal(tensors["d2t"], ids - np.arange(48))
  assert tensors["t2d"].sum() == 48 and tensors["t2d"][ids].all()
  assert "embed_tokens.weight" not in tensors  # the target's embedding is shared, not copied
  back = load_eagle3(str(tmp_path), target)
  assert back == head  # same configuration: shares compiled steps
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), head.weights, back.weights)
  prompts = toy_prompts()
  assert generate(target, prompts, back, 4).tokens == generate(target, prompts, head, 4).tokens


def _variant(tmp_path, name, edit_tensors=None, edit_config=None):
  path = str(tmp_path / name)
  shutil.copytree(FIXTURE, path)
  if edit_tensors:
    file = os.path.join(path, "model.safetensors")
    tensors = read_tensors(file)
    edit_tensors(tensors)
    write_tensors(file, tensors)
  if edit_config:
    with open(os.path.join(path, "config.json")) as f:
      config = json.load(f)
    edit_config(config)
    with open(os.path.join(path, "config.json"), "w") as f:
      json.dump(config, f)
  return path


def _rename_layer(tensors):
  for name in [n for n in tensors if n.startswith("midlayer.")]:
    tensors["layers.0." + name.removeprefix("midlayer.")] = tensors.pop(name)


def test_layers_0_naming_loads(target, tmp_path):
  a = load_eagle3(FIXTURE, target)
  b = load_eagle3(_variant(tmp_path, "layers0", _rename_layer), target)
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y), a.weights, b.weights)


def _set(key, value):
  return lambda d: d.update({key: value})


BAD = {
  "wrong tap count": (
    None,
    lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 1]),
    "has 2 entries",
  ),
  "fc for two taps": (
    _set("fc.weight", np.zeros((48, 96), np.float32)),
    None,
    "'fc.weight' has shape (48, 96), expected (48, 144)",
  ),
  "hidden size": (
    None,
    _set("target_hidden_size", 64),
    "target_hidden_size 64 does not match the target's hidden_size 48",
  ),
  "tap out of range": (
    None,
    lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 1, 3]),
    "has id(s) [4] outside [1, 3]",
  ),
  "duplicate tap (SGLang ids)": (
    None,
    lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 1, 1]),
    "eagle_config.eagle_aux_hidden_state_layer_ids [0, 1, 1] repeats layer id(s) [1]",
  ),
  "duplicate tap (vLLM ids)": (
    None,
    lambda c: (c.pop("eagle_config"), c.update(eagle_aux_hidden_state_layer_ids=[1, 3, 3])),
    "eagle_aux_hidden_state_layer_ids [1, 3, 3] repeats layer id(s) [3]",
  ),
  "vLLM and SGLang ids disagree": (
    None,
    lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 1, 2]),
    "disagree",
  ),
  "missing tensor": (
    lambda t: t.pop("midlayer.self_attn.q_proj.weight"),
    None,
    "missing tensor 'midlayer.self_attn.q_proj.weight'",
  ),
  "missing d2t": (lambda t: t.pop("d2t"), None, "missing tensor 'd2t'"),
  "t2d disagrees": (
    lambda t: t.update(t2d=np.roll(t["t2d"], 1)),
    None,
    "'t2d' disagrees with 'd2t'",
  ),
  "d2t out of range": (lambda t: t.update(d2t=t["d2t"] + 30), None, "'d2t' maps draft ids outside"),
  "second layer": (
    _set("layers.1.mlp.up_proj.weight", np.zeros((80, 48), np.float32)),
    None,
    "unexpected tensor 'layers.1.mlp.up_proj.weight'",
  ),
  "two layers": (None, _set("num_hidden_layers", 2), "num_hidden_layers=2"),
  "draft vocab": (
    None,
    _set("draft_vocab_size", 32),
    "'lm_head.weight' has shape (40, 48), expected (32, 48)",
  ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_checkpoint_names_the_problem(target, tmp_path, case):
  edit_tensors, edit_config, message = BAD[case]
  path = _variant(tmp_path, "bad", edit_tensors, edit_config)
  with pytest.raises(ValueError, match=re.escape(message)):
    load_eagle3(path, target)
