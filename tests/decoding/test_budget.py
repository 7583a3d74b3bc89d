"""k="auto": the estimator, the choice, greedy identity, losslessness, the cost curve, bad input."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.decoding import budget as budget_lib
from specdec.decoding import step_costs as step_costs_lib
from specdec.decoding.budget import Budget
from specdec.drafters import block, draft_lm, eagle3, mtp, ngram
from specdec.drafters.draft_lm import DraftLM
from specdec.drafters.ngram import NGram
from specdec.ops import sampling as S
from tests.decoding.test_spec_gates import (
  Corrupted,
  _exact_joint,
  _gate,
  _sampled_joint,
  _tv,
  small_vocab,  # noqa: F401  (a fixture)
)
from tests.helpers import tiny_model

PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9, 3], [1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 4]]
SMALL = Budget(tiers=(1, 2, 4))
COSTS = (1.0, 1.1, 1.2)  # a memory-bound curve: a wider verify costs little more
WIDE, WIDE_COSTS = Budget(tiers=(1, 2, 4, 8)), (1.0, 1.1, 1.2, 1.4)


@pytest.fixture(scope="module")
def model():
  return tiny_model(num_hidden_layers=6)  # EAGLE-3 taps three distinct layers


@pytest.fixture(scope="module")
def baseline(model):
  return specdec.generate(model, PROMPTS, max_new_tokens=24).tokens


# --- the estimator and the choice, on their own ------------------------------------------------


def test_expected_tokens_follow_the_survival_sum():
  alpha_BJo = jnp.asarray([[1.0, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5]])[..., None]  # rank 0 only
  e = np.asarray(budget_lib.expected_tokens(alpha_BJo, SMALL))
  np.testing.assert_allclose(e, [[2, 3, 5], [1.5, 1.75, 1.9375]])


def test_choice_maximises_the_running_rows_goodput():
  alpha_BJo = jnp.asarray([[0.9] * 4, [0.0] * 4])[..., None]
  costs = jnp.asarray([1.0, 1.1, 1.2])
  both = budget_lib.choose(alpha_BJo, jnp.asarray([True, True]), costs, SMALL)
  # Summed E: (1.9 + 1, 2.71 + 1, 4.44 + 1) / costs = 2.9, 3.37, 4.53: tier 4.
  assert int(both) == 2
  # The good row done: the other's E is 1 at every tier, so the cheapest wins.
  assert int(budget_lib.choose(alpha_BJo, jnp.asarray([False, True]), costs, SMALL)) == 0
  # A steep curve makes the same estimates pick a short draft.
  steep = jnp.asarray([1.0, 1.6, 3.0])
  assert int(budget_lib.choose(alpha_BJo, jnp.asarray([True, False]), steep, SMALL)) == 0


def test_observe_moves_judged_positions_and_pulls_the_rest():
  bud = Budget(tiers=(1, 2, 4), decay=0.5, prior=0.5)
  b = jax.tree.map(jnp.asarray, budget_lib.init_state(2, bud, slots=8))
  # Tier index 1 (k = 2): row 0 accepted 1 of 2 drafts, row 1 is done. A chain's path is 0..k.
  path_BT = jnp.broadcast_to(jnp.arange(5, dtype=jnp.int32), (2, 5))
  out = budget_lib.observe(b, 1, jnp.asarray([True, False]), jnp.asarray([1, 0]), path_BT, bud)
  a = np.asarray(out.alpha_BJo[..., 0])
  # Row 0: draft 1 accepted (0.75), draft 2 rejected (0.25); drafts 3, 4 halfway to 0.25.
  np.testing.assert_allclose(a[0], [0.75, 0.25, 0.375, 0.375])
  np.testing.assert_allclose(a[1], [0.5] * 4)  # a done row learns nothing
  assert np.asarray(out.reached_BJ).tolist() == [[1, 1, 0, 0], [0, 0, 0, 0]]
  assert np.asarray(out.accepted_BJ).tolist() == [[1, 0, 0, 0], [0, 0, 0, 0]]
  assert np.asarray(out.tier_hist_BN).tolist() == [[0, 1, 0], [0, 0, 0]]
  assert np.asarray(out.trace_L)[:2].tolist() == [1, -1] and int(out.n_loop) == 1
  # Tier index 2 (k = 4): row 0 rejects its first draft. Drafts 2-4 were drafted but not reached:
  # they follow draft 1 (0.375) rather than keep what an earlier phase taught them.
  out = budget_lib.observe(out, 2, jnp.asarray([True, False]), jnp.asarray([0, 0]), path_BT, bud)
  np.testing.assert_allclose(np.asarray(out.alpha_BJo[0, :, 0]), [0.375, 0.3125, 0.375, 0.375])


def test_a_depth_s_first_judgements_weigh_as_a_running_mean():
  bud = Budget(tiers=(1, 2), decay=0.875, prior=0.5)
  b = jax.tree.map(jnp.asarray, budget_lib.init_state(1, bud, slots=8))
  path_BT = jnp.arange(3, dtype=jnp.int32)[None]
  seen = []
  for _ in range(8):  # k = 1, its draft accepted every step
    b = budget_lib.observe(b, 0, jnp.asarray([True]), jnp.asarray([1]), path_BT, bud)
    seen.append(float(b.alpha_BJo[0, 0, 0]))
  # The prior counts as one sample while 1 / (n + 1) >= 1 - decay (n <= 7), then the EMA.
  np.testing.assert_allclose(seen[:7], [(0.5 + n) / (n + 1) for n in range(1, 8)], rtol=1e-6)
  np.testing.assert_allclose(seen[7], 0.875 * seen[6] + 0.125, rtol=1e-6)


# --- greedy identity ---------------------------------------------------------------------------


def _drafter(kind, model):
  return {
    "ngram": lambda: ngram(min_n=1, max_n=3),
    "draft_self": lambda: draft_lm(model),
    "draft_other": lambda: draft_lm(tiny_model(seed=1, num_hidden_layers=6)),
    "mtp": lambda: mtp.mtp(model),
    "eagle3": lambda: eagle3.eagle3(model),
    "block": lambda: block.block(model),
  }[kind]()


@pytest.mark.parametrize("kind", ["ngram", "draft_self", "draft_other", "mtp", "eagle3", "block"])
def test_greedy_auto_is_token_identical_to_the_baseline(model, baseline, kind):
  out = specdec.generate(
    model, PROMPTS, max_new_tokens=24, drafter=_drafter(kind, model), k="auto", budget=SMALL,
    step_costs=COSTS,
  )  # fmt: skip
  assert out.tokens == baseline
  s = out.stats
  assert s["k"] == "auto" and s["tiers"] == [1, 2, 4]
  assert sum(s["tier_hist"]) == s["steps"] == sum(s["rows"]["steps"])
  assert s["proposed"] == sum(n * k for n, k in zip(s["tier_hist"], s["tiers"], strict=True))
  assert len(s["k_trace"]) == s["loop_steps"] and set(s["k_trace"]) <= {1, 2, 4}
  assert 1.0 <= s["tau"] <= 5.0 and 1.0 <= s["mean_k"] <= 4.0
  if kind == "draft_self":  # always right: the largest tier, every draft accepted
    assert s["tau"] > 3 and s["per_position_cond"] == [1.0] * 4


def test_greedy_auto_matches_a_fixed_k(model):
  drafter = ngram(min_n=1, max_n=3)
  fixed = specdec.generate(model, PROMPTS, max_new_tokens=24, drafter=drafter, k=2)
  auto = specdec.generate(
    model, PROMPTS, max_new_tokens=24, drafter=drafter, k="auto", budget=SMALL, step_costs=COSTS
  )
  assert auto.tokens == fixed.tokens


# --- the estimator moves the choice ------------------------------------------------------------


def _auto(model, drafter, n=96):
  return specdec.generate(
    model, [PROMPTS[0]], max_new_tokens=n, drafter=drafter, k="auto", budget=WIDE,
    step_costs=WIDE_COSTS,
  ).stats  # fmt: skip


def test_an_always_right_drafter_gets_the_largest_tier(model):
  s = _auto(model, Corrupted(model=model, rate=1.0), n=200)
  assert s["k_trace"][-4:] == [8] * 4, s["k_trace"]
  assert s["tier_hist"][-1] > s["steps"] / 2
  assert s["acceptance_rate"] == 1.0


def test_an_always_wrong_drafter_gets_the_smallest_tier(model):
  s = _auto(model, Corrupted(model=model, rate=0.0))
  assert s["k_trace"][-8:] == [1] * 8, s["k_trace"]
  assert s["tier_hist"][0] > s["steps"] * 0.8
  assert s["accepted"] == 0 and s["tau"] == 1.0


@dataclasses.dataclass(frozen=True, eq=False)
class Phased(DraftLM):
  """The target as its own drafter while a row holds fewer than `until` tokens, wrong after."""

  until: int = 48

  def propose(self, params, state, ctx, k, sampling, key):
    draft_BJ, q, state = super().propose(params, state, ctx, k, sampling, key)
    late_B1 = (ctx.lengths_B >= self.until)[:, None]
    wrong_BJ = (draft_BJ + 1) % self.model.config.vocab_size
    return jnp.where(late_B1, wrong_BJ, draft_BJ), q, state


def test_the_choice_follows_acceptance_along_a_request(model):
  s = _auto(model, Phased(model=model), n=112)
  trace = s["k_trace"]
  assert 8 in trace[:8], trace  # right early: the largest tier is reached
  assert trace[-8:] == [1] * 8, trace  # wrong later: back to the smallest


# --- losslessness ------------------------------------------------------------------------------


@pytest.mark.slow
def test_auto_sampling_is_lossless(small_vocab, monkeypatch):  # noqa: F811
  target, draft = small_vocab
  s = S.Sampling(1.0, 0, 1.0)
  # Default tiers (1, 2, 4, 8). At the prior this curve picks k = 2 (goodput 1.5, 1.509, 1.29,
  # 0.8); a row whose first draft was rejected is still running after 3 tokens' budget allows,
  # and with alpha_1 at 0.4375 it goes on at k = 1 (1.4375 > 1.656 / 1.16): both tiers run.
  costs = np.asarray([1.0, 1.16, 1.5, 2.5])
  monkeypatch.setattr(step_costs_lib, "cost_curve", lambda *a, **kw: costs)
  counts = _sampled_joint(target, draft_lm(draft), s, "onehot", k="auto")
  p = _exact_joint(target, s)
  pval, (tv, eps) = _gate(counts, p), _tv(counts, p)
  assert pval > 1e-4 and tv < eps, (pval, tv, eps)
  out = specdec.generate(
    target, [[3, 7, 1]] * 512, max_new_tokens=3, temperature=1.0, drafter=draft_lm(draft),
    k="auto",
  )  # fmt: skip
  hist = out.stats["tier_hist"]
  assert hist[0] > 0 and hist[1] > 0, hist


# --- the cost curve ----------------------------------------------------------------------------


def test_the_cost_curve_is_measured_once_then_loaded(tmp_path, monkeypatch):
  small = tiny_model(num_hidden_layers=1)
  bud = Budget(tiers=(1, 4))
  args = (small, ngram(), bud, 2, 128, 16)  # batch 2, 128 slots, a 16-token context
  first = step_costs_lib.cost_curve(*args, cache_dir=tmp_path, n_steps=4, reps=2)
  assert first.shape == (2,) and np.all(np.isfinite(first) & (first > 0))
  (saved,) = tmp_path.glob("*.json")
  stored = json.loads(saved.read_text())
  assert stored["key"]["batch"] == 2 and stored["key"]["tiers"] == [1, 4]
  assert stored["key"]["backend"] == "cpu" and stored["seconds"] == first.tolist()

  def refuse(*a, **kw):
    raise AssertionError("measured again")

  monkeypatch.setattr(step_costs_lib, "measure", refuse)
  np.testing.assert_array_equal(step_costs_lib.cost_curve(*args, cache_dir=tmp_path), first)
  with pytest.raises(AssertionError, match="measured again"):  # another batch: another key
    step_costs_lib.cost_curve(small, ngram(), bud, 3, 128, 16, cache_dir=tmp_path)


def test_the_cost_curve_interleaves_the_tiers_over_one_prefill(monkeypatch):
  """A warm-up round over every tier, then rounds that visit each tier once: drift over the
  measurement cannot land on one tier alone. The batch is prefilled once; every call runs on a
  copy of that state (the chunk donates what it is given)."""
  small = tiny_model(num_hidden_layers=1)
  order, chunk, prefills = [], step_costs_lib.decode_chunk, []
  prefill_fields = step_costs_lib.prefill_fields

  def recording(params, draft_params, st, sc, n_steps):
    order.append(sc.k)
    return chunk(params, draft_params, st, sc, n_steps)

  def counted(*args):
    prefills.append(args[-2])
    return prefill_fields(*args)

  monkeypatch.setattr(step_costs_lib, "decode_chunk", recording)
  monkeypatch.setattr(step_costs_lib, "prefill_fields", counted)
  step_costs_lib.measure(small, ngram(), Budget(tiers=(1, 2, 4)), 1, 128, 16, n_steps=2, reps=3)
  assert order == [1, 2, 4] * 4
  assert len(prefills) == 1


def test_generate_measures_the_curve_for_its_own_shapes(tmp_path, monkeypatch):
  small = tiny_model(num_hidden_layers=1)
  monkeypatch.setenv(step_costs_lib.COST_CACHE_ENV, str(tmp_path))
  kw = dict(max_new_tokens=8, drafter=ngram(), k="auto", budget=Budget(tiers=(1, 2)))
  out = specdec.generate(small, PROMPTS[:2], **kw)
  (saved,) = tmp_path.glob("*.json")
  key = json.loads(saved.read_text())["key"]
  assert key["batch"] == 2 and key["context"] == 7 and key["drafter"]["name"] == "ngram"
  assert out.tokens == specdec.generate(small, PROMPTS[:2], max_new_tokens=8).tokens


# --- bad input, refused before anything compiles -----------------------------------------------


@pytest.mark.parametrize(
  "tiers, match",
  [((0, 2), "integers >= 1"), ((2, 1), "strictly increasing"), ((1, 1), "strictly increasing"),
   (("4",), "integers >= 1"), ((), "integers >= 1")],
)  # fmt: skip
def test_bad_tiers_are_refused(model, tiers, match):
  with pytest.raises(ValueError, match=match):
    specdec.generate(model, PROMPTS, drafter=ngram(), k="auto", budget=Budget(tiers=tiers))


def test_a_tier_past_the_cache_room_is_refused(model):
  with pytest.raises(ValueError, match="largest budget tier, k=500.*cache room"):
    specdec.generate(
      model, PROMPTS, max_new_tokens=8, drafter=ngram(), k="auto", budget=Budget(tiers=(1, 500))
    )


@pytest.mark.parametrize("costs", [(1.0, 2.0), (1.0, 0.0, 1.0), (1.0, float("nan"), 1.0)])
def test_a_bad_cost_curve_is_refused(model, costs):
  with pytest.raises(ValueError, match="step_costs must be 3 positive finite"):
    specdec.generate(
      model, PROMPTS, drafter=ngram(), k="auto", budget=SMALL, step_costs=costs, max_new_tokens=4
    )


def test_auto_without_a_drafter_and_tiers_without_auto_are_refused(model):
  with pytest.raises(ValueError, match="k='auto' needs a drafter"):
    specdec.generate(model, PROMPTS, k="auto")
  with pytest.raises(ValueError, match="k='auto' needs a drafter"):
    specdec.generate(model, PROMPTS, drafter=specdec.drafters.null(), k="auto")
  with pytest.raises(
    ValueError, match="budget= chooses the tiers of k='auto' or tree='auto', got k=4"
  ):
    specdec.generate(model, PROMPTS, drafter=ngram(), k=4, budget=SMALL)
  with pytest.raises(ValueError, match="or 'auto', got k='four'"):
    specdec.generate(model, PROMPTS, drafter=ngram(), k="four")


@dataclasses.dataclass(frozen=True)
class Remembers(NGram):
  """An n-gram drafter that keeps its last drafts: a state whose shape follows k."""

  def init(self, params, prompt_BT, lengths_B, target):
    return jnp.zeros((prompt_BT.shape[0], 0), jnp.int32)

  def propose(self, params, state, ctx, k, sampling, key):
    draft_BJ, q, _ = super().propose(params, state, ctx, k, sampling, key)
    return draft_BJ, q, draft_BJ


def test_a_drafter_whose_state_follows_k_is_refused(model):
  with pytest.raises(
    ValueError,
    match=r"ngram drafter.s state differs between tiers \(state.draft enters a k=1 step as "
    r"\(3, 0\)",
  ):
    specdec.generate(model, PROMPTS, drafter=Remembers(), k="auto", budget=SMALL, step_costs=COSTS)


# --- tree="auto": nested tree tiers --------------------------------------------------------------

# Nested: (0,) ; + (1,) (0, 0) ; + (0, 1). The largest numbers the nodes 1:(0,) 2:(1,) 3:(0,0)
# 4:(0,1): two depths, two ranks.
NESTED = Budget(tiers=([(0,)], [(0,), (1,), (0, 0)], [(0,), (1,), (0, 0), (0, 1)]), decay=0.5)
# Nested, but (0, 0) is node 2 of the first tier and node 3 of the others: a step's path is
# renumbered into the largest tier's nodes.
RENUMBERED = ([(0,), (0, 0)], [(0,), (1,), (0, 0)], [(0,), (1,), (0, 0), (0, 1)])


def test_tree_tiers_number_their_nodes_as_the_largest_does():
  bud = Budget(tiers=RENUMBERED)
  assert [i.tolist() for i in bud.index_in_largest] == [[0, 1, 3], [0, 1, 2, 3], [0, 1, 2, 3, 4]]
  assert bud.kids_Nn.tolist() == [[1, 1, 0, 0, 0], [2, 1, 0, 0, 0], [2, 2, 0, 0, 0]]
  assert bud.width_NJ.tolist() == [[1, 1], [2, 1], [2, 2]]
  assert (bud.sizes, bud.depths, bud.k_max) == ([2, 3, 4], [2, 2, 2], 2)


def test_tree_tiers_expect_the_sum_of_their_nodes_path_products():
  alpha_BJo = jnp.asarray([[[0.5, 0.25], [0.5, 0.1]]])
  e = np.asarray(budget_lib.expected_tokens(alpha_BJo, NESTED))
  # (0,) 0.5; (1,) 0.25; (0, 0) 0.5 * 0.5; (0, 1) 0.5 * 0.1.
  np.testing.assert_allclose(e, [[1.5, 2.0, 2.05]])


def test_the_tree_choice_follows_acceptance():
  bud = Budget(tiers=budget_lib.DEFAULT_TREE_TIERS)
  J, o = bud.k_max, bud.shapes[-1].children.shape[1]
  flat, running = jnp.asarray([1.0, 1.05, 1.1, 1.2]), jnp.asarray([True])
  high, low = jnp.full((1, J, o), 0.9), jnp.full((1, J, o), 0.05)
  assert int(budget_lib.choose(high, running, flat, bud)) == 3  # 16 nodes
  assert int(budget_lib.choose(low, running, flat, bud)) == 0  # 2 nodes


def test_observe_moves_judged_tree_nodes_and_pulls_the_undrafted():
  b = jax.tree.map(jnp.asarray, budget_lib.init_state(2, NESTED, slots=8))

  def at(b, tier, running, n_acc, path):
    args = jnp.asarray(running), jnp.asarray(n_acc), jnp.asarray(path, jnp.int32)
    return budget_lib.observe(b, tier, *args, NESTED)

  # Tier 0, the chain (0,): row 0 accepts it, row 1 is done. Judged: (depth 1, rank 0), hit.
  # Undrafted: rank 1 at depth 1 halfway to rank 0's 0.75, depth 2 halfway to depth 1's ranks.
  b = at(b, 0, [True, False], [1, 0], [[0, 1, 1], [0, 0, 0]])
  np.testing.assert_allclose(b.alpha_BJo[0], [[0.75, 0.625], [0.625, 0.5625]])
  np.testing.assert_allclose(b.alpha_BJo[1], np.full((2, 2), 0.5))  # a done row learns nothing
  # Tier 1: row 0 accepts (0,) then (0, 0): both root children judged (rank 0 hit), node 1's
  # one child in the tier judged and hit; rank 1 at depth 2 (not in tier 1) pulled to rank 0's.
  # Row 1 accepts nothing: the root's children missed; depth 2, not reached, pulled to depth 1's.
  b = at(b, 1, [True, True], [2, 0], [[0, 1, 3], [0, 0, 0]])
  np.testing.assert_allclose(b.alpha_BJo[0], [[0.875, 0.3125], [0.8125, 0.6875]])
  np.testing.assert_allclose(b.alpha_BJo[1], [[0.25, 0.25], [0.375, 0.375]])
  # Tier 2 (the largest): row 0 accepts (1,), a leaf, so depth 2 was not judged: pulled again.
  b = at(b, 2, [True, False], [1, 0], [[0, 2, 2], [0, 0, 0]])
  np.testing.assert_allclose(b.alpha_BJo[0], [[0.4375, 0.65625], [0.625, 0.671875]])
  assert np.asarray(b.reached_BJ).tolist() == [[3, 1], [1, 0]]
  assert np.asarray(b.accepted_BJ).tolist() == [[3, 1], [0, 0]]
  assert np.asarray(b.tier_hist_BN).tolist() == [[1, 1, 1], [0, 1, 0]]


@pytest.mark.parametrize("kind", ["ngram", "draft_other"])
def test_greedy_tree_auto_is_token_identical_to_the_baseline(model, baseline, kind):
  # ngram on the default family; draft_lm on a small one given as PATHS.
  kw = dict(step_costs=(1.0, 1.05, 1.1, 1.2))
  if kind == "draft_other":
    kw = dict(budget=Budget(tiers=RENUMBERED), step_costs=(1.0, 1.1, 1.2))
  out = specdec.generate(
    model, PROMPTS, max_new_tokens=24, drafter=_drafter(kind, model), tree="auto", **kw
  )
  assert out.tokens == baseline
  s = out.stats
  sizes = [2, 4, 8, 16] if kind == "ngram" else [2, 3, 4]
  assert (s["k"], s["tree"], s["tiers"]) == ("auto", "auto", sizes)
  assert len(s["tier_trees"]) == len(sizes)
  assert sum(s["tier_hist"]) == s["steps"] == sum(s["rows"]["steps"])
  assert len(s["k_trace"]) == s["loop_steps"] and set(s["k_trace"]) <= set(sizes)
  assert len(set(s["k_trace"])) > 1  # the choice moved: more than one tier's step ran


@pytest.mark.parametrize(
  "tiers, match",
  [
    (([(0,), (1,)], [(0,), (0, 0)]), r"tiers\[0\] is not nested in tiers\[1\]: its path \(1,\)"),
    (([(0,)], [(0,)]), r"tiers\[1\] adds no node to tiers\[0\]"),
    ((1, [(0,), (1,)]), "integers >= 1 \\(chains\\) or trees"),
  ],
)  # fmt: skip
def test_tree_tiers_that_do_not_nest_are_refused(model, tiers, match):
  with pytest.raises(ValueError, match=match):
    specdec.generate(model, PROMPTS, drafter=ngram(), tree="auto", budget=Budget(tiers=tiers))


def test_tree_auto_arguments_are_refused_by_name(model):
  with pytest.raises(ValueError, match=r"budget tiers\[1\]: tree: path \(0, 1\) has no sibling"):
    Budget(tiers=([(0,)], [(0,), (0, 1)]))
  with pytest.raises(ValueError, match="tree='auto' chooses among trees"):
    specdec.generate(model, PROMPTS, drafter=ngram(), tree="auto", k=2)
  with pytest.raises(ValueError, match=r"budget tiers \[1, 2, 4\] run with k='auto'"):
    specdec.generate(model, PROMPTS, drafter=ngram(), tree="auto", budget=SMALL)
  with pytest.raises(ValueError, match=r"budget tiers \[\[\[0\]\].* run with tree='auto'"):
    specdec.generate(model, PROMPTS, drafter=ngram(), k="auto", budget=NESTED)
  with pytest.raises(ValueError, match="tree='auto' needs a drafter"):
    specdec.generate(model, PROMPTS, tree="auto")


def test_the_cost_curve_of_tree_tiers(tmp_path):
  small = tiny_model(num_hidden_layers=1)
  bud = Budget(tiers=([(0,)], [(0,), (1,), (0, 0)]))
  seconds = step_costs_lib.cost_curve(small, ngram(), bud, 2, 128, 16, cache_dir=tmp_path,
                                      n_steps=4, reps=2)  # fmt: skip
  assert seconds.shape == (2,) and np.all(np.isfinite(seconds) & (seconds > 0))
  (saved,) = tmp_path.glob("*.json")
  assert json.loads(saved.read_text())["key"]["tiers"] == [[[0]], [[0], [1], [0, 0]]]
