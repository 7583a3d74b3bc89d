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


def test_every_model_within_the_size_budget():
  assert set(os.listdir(ZOO)) == set(MODELS), sorted(os.listdir(ZOO))
  # A link (the draft LM's and the hybrid's tokenizer.json, the target's) counts as its own few
  # bytes, as `du -b`.
  total = sum(
    os.lstat(os.path.join(root, f)).st_size for root, _, files in os.walk(ZOO) for f in files
  )
  assert total <= 48 * 2**20, f"zoo is {total / 2**20:.2f} MiB"


def _params(model) -> int:
  return sum(x.size for x in jax.tree.leaves(model.params))


def test_target_and_draft_lm_are_the_issue_s_sizes():
  target = specdec.load(resolve_path("zoo:target"), dtype=jnp.float32)
  draft = specdec.load(resolve_path("zoo:draft_lm"), dtype=jnp.float32)
  assert 5e6 <= _params(target) <= 15e6 and 1e6 <= _params(draft) <= 0.1 * _params(target)
  assert target.config.num_layers >= 12 and target.config.max_position_embeddings >= 4096
  assert target.tokenizer.get_vocab() == draft.tokenizer.get_vocab()


@pytest.fixture(scope="module")
def target():
  return specdec.load(resolve_path("zoo:target"), dtype=jnp.float32)


# Measured (CPU, float32, these 2 prompts, 32 tokens, k = 4): mtp 2.70, eagle3 2.21, block8 2.30,
# block16 1.68, dflash2 2.38, dspark 1.94, draft_lm 1.82. The same recipes' second build, trained
# against another target of this architecture (docs/zoo.md, "Second training"), give 1.38, 1.59,
# 1.05, 1.24, (no dflash2), 1.32 against this one: each bound lies between the two. That build's
# draft LM gives 1.82 too, so the draft LM's bound checks acceptance, not which target it learned.
MIN_TAU = {
  "draft_lm": 1.5, "mtp": 2.0, "eagle3": 1.9, "block8": 1.6, "block16": 1.55, "dflash2": 1.6,
  "dspark": 1.6,
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(MIN_TAU))
def test_each_learned_drafter_is_accepted_by_the_shipped_target(target, name):
  path = resolve_path(f"zoo:{name}")
  if name == "draft_lm":
    drafter = specdec.drafters.draft_lm(specdec.load(path, dtype=jnp.float32))
  else:
    drafter = specdec.load_drafter(path, target)
  prompts = [p.text for p in workload.select(workload.load_humaneval(), 2)]
  out = specdec.generate(target, prompts, max_new_tokens=32, drafter=drafter, k=4)
  assert out.stats["tau"] >= MIN_TAU[name], out.stats["tau"]


def test_the_hybrid_pair_is_a_qwen3_next_target_whose_head_it_accepts():
  hybrid = specdec.load(resolve_path("zoo:hybrid"), dtype=jnp.float32)
  assert hybrid.config.model_type == "qwen3_next" and hybrid.config.linear_layers == (0, 1, 2)
  link = os.path.join(ZOO, "hybrid", "tokenizer.json")
  assert os.path.realpath(link) == os.path.realpath(os.path.join(ZOO, "target", "tokenizer.json"))
  head = specdec.load_drafter(resolve_path("zoo:hybrid_mtp"), hybrid)
  prompts = [p.text for p in workload.select(workload.load_humaneval(), 2)]
  want = specdec.generate(hybrid, prompts, max_new_tokens=32).tokens
  out = specdec.generate(hybrid, prompts, max_new_tokens=32, drafter=head, k=4)
  # Measured 2.58 (2026-12-06): the bound sits a quarter below, as MIN_TAU's do.
  assert out.tokens == want and out.stats["tau"] >= 1.9, out.stats["tau"]
