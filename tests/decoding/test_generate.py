"""The decoding loop: batching, stopping, determinism, sampling transforms, input checks."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.decoding import generate as generate_lib
from specdec.decoding.generate import cache_slots, prompt_bucket
from specdec.decoding.step import StepConfig, decode_chunk, prefill
from specdec.drafters import block, draft_lm, eagle3, mtp, ngram
from specdec.ops import sampling as S
from tests.helpers import tiny_model

PROMPTS = [
  [1, 2, 3, 4, 5, 6, 7],
  [9, 8],
  [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 11],
]


@pytest.fixture(scope="module")
def model():
  return tiny_model()


def test_batch_rows_match_single_rows(model):
  batch = specdec.generate(model, PROMPTS, max_new_tokens=20)
  for p, out in zip(PROMPTS, batch.tokens, strict=True):
    assert specdec.generate(model, [p], max_new_tokens=20).tokens[0] == out
  assert [len(t) for t in batch.tokens] == [20, 20, 20]
  assert batch.stats["rows"]["steps"] == [19, 19, 19]  # the first token comes from prefill
  assert batch.stats["tau"] == 1.0


def test_generation_continues_the_logits_argmax(model):
  out = specdec.generate(model, [PROMPTS[0]], max_new_tokens=6).tokens[0]
  seq = PROMPTS[0] + out
  logits = np.asarray(model.logits(np.asarray([seq])))
  assert logits[0, len(PROMPTS[0]) - 1 : -1].argmax(-1).tolist() == out


def test_eos_stops_each_row(model):
  free = specdec.generate(model, PROMPTS, max_new_tokens=20).tokens
  eos = free[0][5]
  m = specdec.Model(model.config.replace(eos_token_ids=(eos,)), model.params, None, model.dtype)
  out = specdec.generate(m, PROMPTS, max_new_tokens=20)
  for row, full in zip(out.tokens, free, strict=True):
    cut = full.index(eos) + 1 if eos in full else len(full)
    assert row == full[:cut]


def test_sampling_is_deterministic_for_a_seed(model):
  kw = dict(max_new_tokens=16, temperature=1.0, top_k=20, top_p=0.9)
  a = specdec.generate(model, PROMPTS, seed=3, **kw).tokens
  assert a == specdec.generate(model, PROMPTS, seed=3, **kw).tokens
  assert a != specdec.generate(model, PROMPTS, seed=4, **kw).tokens


def test_transform_order_temperature_then_top_k_then_top_p():
  logits = jnp.log(jnp.asarray([0.5, 0.2, 0.15, 0.1, 0.05]))
  # top-k=3 keeps {.5,.2,.15} -> renormalised {.588,.235,.176}; top-p=0.8 then keeps the first two.
  p = np.asarray(S.probs(logits, S.Sampling(1.0, 3, 0.8)))
  np.testing.assert_allclose(p, [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0], rtol=1e-5)
  # Temperature first: at T=0.5 the top token alone carries >= 0.8 of the mass.
  p = np.asarray(S.probs(logits, S.Sampling(0.5, 3, 0.8)))
  np.testing.assert_allclose(p, [1, 0, 0, 0, 0], atol=1e-6)
  assert np.asarray(S.probs(logits, S.Sampling())).tolist() == [1, 0, 0, 0, 0]


def test_chunk_moves_nothing_between_host_and_device(model):
  sc = StepConfig(model.config, model.dtype, ngram(), 3, S.Sampling(), "greedy", ())
  prompt = jnp.zeros((2, prompt_bucket(4)), jnp.int32)
  slots = cache_slots(prompt.shape[1], 16, 3)
  args = (model.params, (), prompt, jnp.array([4, 2]), jnp.array([16, 16]), jax.random.key(0))
  st = prefill(*args, sc, slots)
  decode_chunk(model.params, (), st, sc, 4)  # compile outside the guard
  st = prefill(*args, sc, slots)
  with jax.transfer_guard("disallow"):
    st = decode_chunk(model.params, (), st, sc, 4)
  hlo = decode_chunk.lower(model.params, (), st, sc, 4).as_text()
  assert "callback" not in hlo and "outfeed" not in hlo
  assert int(st.steps.max()) == 4


@pytest.mark.parametrize(
  "kw, fragment",
  [
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(drafter=ngram(), k=0), "k must be"),
    (dict(drafter=ngram(), k=600), "cache room"),
    (dict(max_new_tokens=600), "cache room"),
    (dict(drafter=ngram(), k=2, acceptance="typical"), "unknown acceptance mode"),
    (dict(acceptance="greedy", temperature=0.7), "needs temperature=0"),
    (dict(drafter=specdec.drafters.draft_lm(tiny_model(vocab_size=80)), k=2), "vocabulary"),
    (dict(drafter=ngram(min_n=3, max_n=2), k=2), "min_n"),
    (dict(prefill_chunk=24), "prefill_chunk must be a power of two"),
  ],
)
def test_bad_input_is_refused_before_compiling(model, kw, fragment):
  with pytest.raises(ValueError, match=fragment):
    specdec.generate(model, PROMPTS, **{"max_new_tokens": 8, **kw})


def test_prompt_longer_than_cache(model):
  with pytest.raises(ValueError, match="cache room"):
    specdec.generate(model, [[1] * 510], max_new_tokens=8)


@pytest.mark.parametrize("name", ["ngram", "draft_lm", "mtp", "eagle3", "block"])
def test_a_prompt_prefilled_in_slices_decodes_the_same(name):
  """A 40-token prompt (bucket 64) through 16-token prefill slices: same tokens, with every kind of
  drafter, those that read the target's taps and hidden states over the whole prompt included."""
  model = tiny_model(num_hidden_layers=6)  # EAGLE-3 taps three distinct layers
  drafter = {
    "ngram": lambda: ngram(),
    "draft_lm": lambda: specdec.drafters.draft_lm(tiny_model(seed=1)),
    "mtp": lambda: mtp.mtp(model),
    "eagle3": lambda: eagle3.eagle3(model),
    "block": lambda: block.block(model),
  }[name]()
  prompt = [[(7 * i + 3) % 60 + 2 for i in range(40)]]
  run = lambda chunk: specdec.generate(  # noqa: E731
    model, prompt, max_new_tokens=24, drafter=drafter, k=3, prefill_chunk=chunk
  )
  whole, sliced = run(64), run(16)
  assert sliced.tokens == whole.tokens
  assert sliced.stats["accepted"] == whole.stats["accepted"]


def test_a_cut_last_step_counts_as_emitted_and_censored(model):
  # The target as its own draft LM: every draft is accepted. k = 4, 8 new tokens: the prefill
  # gives token 1, step 1 accepts 4 and emits 5 (tokens 2-6), step 2 accepts 4 but the budget
  # lets 2 through. tau = 7 emitted / 2 forwards; the verifier's count says 1 + 4.
  g = specdec.generate(model, [PROMPTS[0]], max_new_tokens=8, drafter=draft_lm(model), k=4)
  s = g.stats
  assert len(g.tokens[0]) == 8
  assert (s["steps"], s["emitted"], s["censored"]) == (2, 7, 1)
  assert s["tau"] == 3.5 and s["tau_accepted"] == 5.0
  assert s["acceptance_rate"] == 1.0 and s["accepted"] == 8 and s["proposed"] == 8
  assert s["rows"]["emitted"] == [7] and s["rows"]["steps"] == [2]
  assert np.asarray(s["censored_hist"]).sum(0).tolist() == [0, 0, 0, 0, 1]


@pytest.mark.parametrize("k", [0, 3])
def test_the_host_looks_once_per_chunk_whatever_the_arm(model, monkeypatch, k):
  monkeypatch.setattr(generate_lib, "CHUNK_STEPS", 4)
  drafter = ngram() if k else None
  s = specdec.generate(model, PROMPTS, max_new_tokens=20, drafter=drafter, k=k or None).stats
  assert s["loop_steps"] == max(s["rows"]["steps"])
  assert s["host_syncs"] == 1 + math.ceil(s["loop_steps"] / 4)  # the prefill, then each chunk


def test_a_chunk_stops_on_the_device_when_every_row_is_done(model):
  # The key advances every iteration, done rows or not: equal keys mean equal iteration counts.
  sc = StepConfig(model.config, model.dtype, ngram(), 3, S.Sampling(), "greedy", ())
  prompt = jnp.zeros((2, prompt_bucket(4)), jnp.int32)
  slots = cache_slots(prompt.shape[1], 16, 3)
  args = (model.params, (), prompt, jnp.array([4, 2]), jnp.array([5, 5]), jax.random.key(0))
  short = decode_chunk(model.params, (), prefill(*args, sc, slots), sc, 4)
  long = decode_chunk(model.params, (), prefill(*args, sc, slots), sc, 64)
  assert bool(short.done.all()) and int(short.steps.max()) <= 4
  assert jax.random.key_data(long.key).tolist() == jax.random.key_data(short.key).tolist()
  assert np.asarray(long.tokens).tolist() == np.asarray(short.tokens).tolist()


def test_compile_ahead_builds_what_generate_then_runs(model):
  # Shapes no other test uses (bucket 32, 13 new tokens, k = 5), so nothing is cached in memory.
  kw = dict(max_new_tokens=13, drafter=ngram(), k=5, min_bucket=32, seed=7)
  built = generate_lib.compile_ahead(model, PROMPTS[:2], **kw)
  assert built.count >= 2 and built.seconds > 0  # the prefill and the decode chunk
  g = specdec.generate(model, PROMPTS[:2], **kw)
  assert g.stats["compiles"] <= 1 and len(g.tokens[0]) == 13  # at most one tiny eager op
  with pytest.raises(TypeError):
    generate_lib.compile_ahead(model, PROMPTS[:2], max_new_tokens=13, nonsense=1)


def test_every_k_shares_the_prefill_and_the_baseline_shares_the_step(model):
  # Shapes no other test uses (bucket 64, 11 new tokens), so nothing is cached in memory.
  kw = dict(max_new_tokens=11, drafter=ngram(), min_bucket=64)
  first = specdec.generate(model, PROMPTS[:2], k=3, **kw)
  assert first.stats["compiles"] >= 2  # the prefill and the k = 3 decode chunk
  assert specdec.generate(model, PROMPTS[:2], k=6, **kw).stats["compiles"] == 1  # the chunk only
  same = specdec.generate(model, PROMPTS[:2], k=6, acceptance="reject", **kw)
  assert same.stats["compiles"] == 0  # the k = 6 chunk, the rejection a run-time flag
  assert same.stats["accepted"] == 0 and same.stats["acceptance"] == "reject"
  assert same.tokens == specdec.generate(model, PROMPTS[:2], max_new_tokens=11).tokens
