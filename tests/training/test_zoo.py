"""The shipped zoo (issue 5): every model is there, in its budget, and its drafters were trained
against the target that ships beside them (a stale drafter still loads, but is not accepted)."""

import os

import jax
import jax.numpy as jnp
import pytest

import specdec
from specdec.checkpoint.zoo import resolve_path
from specdec.data import workload
from specdec.training.zoo import MODELS

ZOO = os.path.dirname(resolve_path("zoo:target"))


# The zoo build's models that the shipped zoo does not hold yet: the zoo issue's recipe adds them,
# and the next build on the GPU ships them (then this is empty).
NOT_YET_SHIPPED = ("dflash2", "dspark")


def test_every_model_within_the_size_budget():
  assert sorted(os.listdir(ZOO)) == sorted(m for m in MODELS if m not in NOT_YET_SHIPPED)
  total = sum(
    os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(ZOO) for f in files
  )
  assert total <= 32 * 2**20, f"zoo is {total / 2**20:.2f} MiB"


def _params(model) -> int:
  return sum(x.size for x in jax.tree.leaves(model.params))


def test_target_and_draft_lm_are_the_issue_s_sizes():
  target = specdec.load(resolve_path("zoo:target"), dtype=jnp.float32)
  draft = specdec.load(resolve_path("zoo:draft_lm"), dtype=jnp.float32)
  assert 5e6 <= _params(target) <= 15e6 and 1e6 <= _params(draft) <= 3e6
  assert target.config.max_position_embeddings >= 2048
  assert target.tokenizer.get_vocab() == draft.tokenizer.get_vocab()


@pytest.fixture(scope="module")
def target():
  return specdec.load(resolve_path("zoo:target"), dtype=jnp.float32)


# Measured (CPU, float32, these 2 prompts, 32 tokens, k = 4): draft_lm 3.67, mtp 3.14, eagle3 2.03,
# block8 1.42, block16 1.48. The first zoo's drafters, trained against the previous target, give
# 1.37, 1.09, 1.07, 1.05, 1.02 against this one: each bound lies between the two.
MIN_TAU = {"draft_lm": 2.0, "mtp": 2.0, "eagle3": 1.5, "block8": 1.25, "block16": 1.25}


@pytest.mark.parametrize("name", sorted(MIN_TAU))
def test_each_learned_drafter_is_accepted_by_the_shipped_target(target, name):
  d = specdec.drafters
  path = resolve_path(f"zoo:{name}")
  drafter = {
    "draft_lm": lambda: d.draft_lm(specdec.load(path, dtype=jnp.float32)),
    "mtp": lambda: d.load_mtp(path, target),
    "eagle3": lambda: d.load_eagle3(path, target),
    "block8": lambda: d.load_block(path, target),
    "block16": lambda: d.load_block(path, target),
  }[name]()
  prompts = [p.text for p in workload.select(workload.load_humaneval(), 2)]
  out = specdec.generate(target, prompts, max_new_tokens=32, drafter=drafter, k=4)
  assert out.stats["tau"] >= MIN_TAU[name], out.stats["tau"]
