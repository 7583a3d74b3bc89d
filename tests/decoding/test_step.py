"""The step's emit decision (`emit_counts`) on small arrays, and the step's named phases."""

import jax
import jax.numpy as jnp
import numpy as np

from specdec.decoding.generate import cache_slots
from specdec.decoding.step import StepConfig, decode_chunk, emit_counts, prefill
from specdec.drafters import ngram
from specdec.ops.sampling import Sampling
from tests.helpers import tiny_model

EOS = 7


def _emit(n_acc, emit, budget, done, eos_ids=(EOS,)):
  n_emit, eos = emit_counts(
    jnp.asarray(n_acc, jnp.int32),
    jnp.asarray(emit, jnp.int32),
    jnp.asarray(budget, jnp.int32),
    jnp.asarray(done, bool),
    eos_ids,
  )
  return np.asarray(n_emit).tolist(), np.asarray(eos).tolist()


def test_a_running_row_emits_its_accepted_drafts_and_one_more():
  # k = 4: T = 5 verify outputs per row; no EOS, budget to spare.
  emit = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]]
  assert _emit([0, 2, 4], emit, [10, 10, 10], [False] * 3) == ([1, 3, 5], [False] * 3)


def test_the_budget_cuts_what_a_row_emits():
  emit = [[1, 2, 3, 4, 5]] * 3
  n, eos = _emit([4, 4, 1], emit, [1, 3, 2], [False] * 3)
  assert n == [1, 3, 2]  # min(n_acc + 1, budget)
  assert eos == [False] * 3


def test_an_eos_ends_the_row_just_after_it():
  emit = [[1, EOS, 3, 4, 5], [EOS, 2, 3, 4, 5], [1, 2, 3, 4, EOS]]
  assert _emit([4, 4, 4], emit, [10, 10, 10], [False] * 3) == ([2, 1, 5], [True] * 3)


def test_an_eos_past_what_the_row_emits_is_ignored():
  # Row 0: EOS after the accepted prefix plus one (those entries are meaningless). Row 1: EOS
  # beyond the budget. Row 2: the first of two EOS tokens ends the row.
  emit = [[1, 2, EOS, 4, 5], [1, 2, 3, EOS, 5], [1, EOS, EOS, 4, 5]]
  n, eos = _emit([1, 4, 4], emit, [10, 3, 10], [False] * 3)
  assert n == [2, 3, 2]
  assert eos == [False, False, True]


def test_budget_and_eos_together_take_the_earlier_cut():
  emit = [[1, EOS, 3, 4, 5], [1, 2, 3, EOS, 5]]
  n, eos = _emit([4, 4], emit, [3, 3], [False, False])
  assert n == [2, 3]  # row 0: the EOS at 1 comes before the budget of 3; row 1: the budget first
  assert eos == [True, False]


def test_rows_already_done_emit_nothing():
  emit = [[EOS, 2, 3, 4, 5], [1, 2, 3, 4, 5]]
  assert _emit([4, 2], emit, [10, 0], [True, True]) == ([0, 0], [False, False])


def test_every_listed_eos_id_counts_and_none_means_no_eos():
  emit = [[1, 9, 3, 4, 5], [1, 2, EOS, 4, 5]]
  assert _emit([4, 4], emit, [10, 10], [False, False], (EOS, 9)) == ([2, 3], [True, True])
  assert _emit([4, 4], emit, [10, 10], [False, False], ()) == ([5, 5], [False, False])


def test_the_step_phases_are_named_scopes():
  """A profile attributes the step's ops to draft, verify, accept and commit."""
  model, drafter, k = tiny_model(), ngram(), 3
  sc = StepConfig(model.config, model.dtype, drafter, k, Sampling(), "greedy", ())
  B, T, max_new = 1, 16, 8
  prompt = jnp.ones((B, T), jnp.int32)
  args = (jnp.full((B,), 4, jnp.int32), jnp.full((B,), max_new, jnp.int32), jax.random.key(0))
  st = prefill(model.params, drafter.params, prompt, *args, sc, cache_slots(T, max_new, k))
  text = decode_chunk.lower(model.params, drafter.params, st, sc, 1).as_text(debug_info=True)
  for scope in ("draft", "verify", "accept", "commit"):
    assert f"/{scope}/" in text, scope
