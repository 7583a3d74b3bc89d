"""The oracle drafter: greedy identity through generate (chain, tree, k="auto"), acceptance that
follows the configured miss rate, per rank in a tree, and changes along the request when asked."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.decoding.tree import tree
from specdec.drafters.base import Context
from specdec.drafters.oracle import Oracle, miss_profile, oracle
from specdec.lab.trees import PRESETS
from tests.helpers import tiny_model

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [9, 8], [3, 3, 3, 3, 3, 3, 3, 11]]
NEW = 40
V = 64


@pytest.fixture(scope="module")
def model():
  return tiny_model()


@pytest.fixture(scope="module")
def rows(model):
  out = specdec.generate(model, PROMPTS, max_new_tokens=NEW)
  assert all(len(set(t)) >= 5 for t in out.tokens)  # a continuation worth drafting
  return [p + t for p, t in zip(PROMPTS, out.tokens, strict=True)]


def _decode(model, rows, drafter, **kw):
  out = specdec.generate(model, PROMPTS, max_new_tokens=NEW, drafter=drafter, **kw)
  assert out.tokens == [r[len(p) :] for r, p in zip(rows, PROMPTS, strict=True)]
  return out.stats


@pytest.mark.parametrize(
  "kw", [dict(k=4), dict(tree=PRESETS["skewed3"]), dict(k="auto", step_costs=[1.0, 1, 1, 1.2])]
)
def test_greedy_identity_with_misses(model, rows, kw):
  stats = _decode(model, rows, oracle(rows, V, miss=0.3), **kw)
  assert 1.0 < stats["tau"] < stats.get("verify_width", 9)  # drafts accepted and rejected


def test_acceptance_follows_the_miss_rate(model, rows):
  for miss in (0.2, 0.6):
    stats = _decode(model, rows, oracle(rows, V, miss=miss), k=4)
    # alpha pools every judged draft (~100 here): its std is about 0.05.
    assert abs(stats["alpha"] - (1 - miss)) < 0.15, (miss, stats["alpha"])
  assert _decode(model, rows, oracle(rows, V, miss=0.0), k=4)["acceptance_rate"] == 1.0
  assert _decode(model, rows, oracle(rows, V, miss=1.0), k=4)["acceptance_rate"] == 0.0


def _steps(k: int, switch: int) -> int:
  """Steps a decode takes when every draft before generated position `switch` hits, none after."""
  g, steps = 1, 0  # the prefill emits generated position 0
  while g < NEW:
    g += min(min(max(switch - g, 0), k) + 1, NEW - g)
    steps += 1
  return steps


@pytest.mark.parametrize("switch", [0, 13, NEW])
def test_acceptance_changes_along_the_request(model, rows, switch):
  miss = miss_profile([len(p) for p in PROMPTS], max(map(len, rows)), 0.0, 1.0, switch)
  stats = _decode(model, rows, oracle(rows, V, miss=miss), k=4)
  assert stats["rows"]["steps"] == [_steps(4, switch)] * len(PROMPTS)


def test_auto_follows_a_change_of_acceptance(model, rows):
  """All hits, then all misses: the budget goes from its largest tier to its smallest."""
  miss = miss_profile([len(p) for p in PROMPTS], max(map(len, rows)), 0.0, 1.0, NEW // 2)
  costs = [1.0, 1.05, 1.1, 1.2]
  stats = _decode(model, rows, oracle(rows, V, miss=miss), k="auto", step_costs=costs)
  trace = stats["k_trace"]
  assert trace[-1] == 1 and max(trace) == 8 and 1 in trace[trace.index(8) :], trace


def _propose_tree(paths, miss, B=20000):
  t = tree(paths)
  answer_BS = np.tile(np.arange(16, dtype=np.int32), (B, 1))
  d = oracle(answer_BS.tolist(), V, miss=miss, rank_scale=0.5)
  ctx = Context(jnp.zeros((B, 16), jnp.int32), jnp.full((B,), 3, jnp.int32))
  draft_BJ, _ = jax.jit(d.propose_tree, static_argnums=3)(
    d.params, (), ctx, t, None, jax.random.key(0)
  )
  return t, np.asarray(draft_BJ)


def test_tree_ranks_carry_the_answer_like_a_top_k_drafter():
  t, draft_BJ = _propose_tree([(0,), (1,), (2,), (0, 0), (0, 1)], 0.4)
  want = 3  # the root sits at position 2, its children draft position 3
  carry = (draft_BJ[:, :3] == want).mean(0)
  p1, p2 = 0.6 * 0.5, 0.6 * 0.25  # conditional hits of ranks 1 and 2
  np.testing.assert_allclose(carry, [0.6, 0.4 * p1, 0.4 * (1 - p1) * p2], atol=0.02)
  assert ((draft_BJ[:, :3] == want).sum(1) <= 1).all()  # the answer at most once
  for siblings in ([0, 1, 2], [3, 4]):
    s_BJ = np.sort(draft_BJ[:, siblings], 1)
    assert (np.diff(s_BJ, axis=1) != 0).all()  # siblings distinct
  assert ((draft_BJ[:, 3:] == 4).sum(1) <= 1).all()
  np.testing.assert_allclose((draft_BJ[:, 3] == 4).mean(), 0.6, atol=0.02)


def test_miss_rates_apply_per_position():
  miss_S = np.ones(16, np.float32)
  miss_S[3] = 0.0  # position 3 always hits, every other position misses
  _, draft_BJ = _propose_tree([(0,), (0, 0)], miss_S, B=64)
  assert (draft_BJ[:, 0] == 3).all() and (draft_BJ[:, 1] != 4).all()


def test_refusals():
  with pytest.raises(ValueError, match=r"miss probabilities must lie in \[0, 1\]"):
    oracle([[1, 2]], V, miss=1.5)
  with pytest.raises(ValueError, match="vocab 32 differs from the target's 64"):
    oracle([[1, 2]], 32).validate(tiny_model().config, 2, 64)
  with pytest.raises(ValueError, match="needs more than the 2 distinct tokens"):
    oracle([[1, 2]], 2).validate_tree(tree([(0,), (1,)]))


def test_oracles_of_one_vocabulary_share_compiled_steps():
  a, b = oracle([[1, 2]], V, miss=0.1), oracle([[3, 4, 5]], V, miss=0.9, rank_scale=0.2)
  assert a == b and hash(a) == hash(b) and a != oracle([[1, 2]], 32)
  assert isinstance(a, Oracle) and a.name == "oracle"
  assert [b.params[0].shape, b.params[1].shape] == [(1, 3), (1, 3)]
