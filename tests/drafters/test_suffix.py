"""The suffix drafter against arctic-inference's own suffix decoding (tests/fixtures/suffix), greedy
identity through `generate`, the earlier-request store at work, and its option errors."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.drafters import ngram, suffix
from specdec.drafters.base import Context
from specdec.drafters.suffix import speculate
from tests.helpers import tiny_config, tiny_model

REF = json.load(open("tests/fixtures/suffix/stream.json"))
# The buffer holds the recorded prompt and response, the store the cached response, exactly: every
# slot more is work in each of the recorded steps' drafts.
SLOTS, ROWS = len(REF["request"]["prompt"]) + len(REF["request"]["response"]), 32


def _ref_drafter():
  st = REF["settings"]
  return suffix(
    max_depth=st["max_depth"], max_spec_factor=st["max_spec_factor"],
    min_token_prob=st["min_token_prob"], history=[REF["cached"]["response"]],
    store_size=len(REF["cached"]["response"]),
  )  # fmt: skip


def _occurrences(seqs, pattern) -> int:
  n = len(pattern)
  return sum(list(s[i : i + n]) == pattern for s in seqs for i in range(len(s) - n + 1))


@pytest.mark.slow
@pytest.mark.optimized
def test_drafts_and_acceptance_match_arctic_on_the_recorded_stream():
  # Every step of arctic's own run, from the context it drafted from: the same draft, match
  # length, float32 score and accepted count, except where arctic broke a tie between equally
  # frequent continuations by its sibling-list history (the module docstring says how specdec
  # breaks it); there the two tokens must truly tie.
  dr, steps = _ref_drafter(), REF["steps"]
  prompt, resp = REF["request"]["prompt"], REF["request"]["response"]
  P, n_steps = len(prompt), REF["steps_total"]
  done = np.cumsum([0] + [a + 1 for a in steps["num_accept_toks"]])[:n_steps]
  buf_S = np.zeros((SLOTS,), np.int32)
  buf_S[: P + len(resp)] = prompt + resp
  f = jax.jit(lambda p, t, n, pl: speculate(dr, p, t, n, pl, REF["settings"]["max_spec_tokens"]))
  got = []
  for lo in range(0, n_steps, ROWS):
    lengths_B = np.full((ROWS,), P, np.int32)
    lengths_B[: min(ROWS, n_steps - lo)] += done[lo : lo + ROWS]
    tokens_BS = np.broadcast_to(buf_S, (ROWS, SLOTS))
    out = f(dr.params, jnp.asarray(tokens_BS), jnp.asarray(lengths_B), jnp.full((ROWS,), P))
    got += list(zip(*[np.asarray(a).tolist() for a in out], strict=True))[: n_steps - lo]
  ties = []
  for i, (draft, n, score, m) in enumerate(got):
    draft, n_i = draft[:n], int(done[i])
    acc = next((j for j, t in enumerate(draft) if n_i + j >= len(resp) or t != resp[n_i + j]), n)
    ref = steps["token_ids"][i]
    assert (m, np.float32(score)) == (steps["match_len"][i], np.float32(steps["score"][i])), i
    assert n == len(ref) == steps["num_spec_toks"][i], i
    if draft == ref:
      assert acc == steps["num_accept_toks"][i], i
      continue
    ties.append(i)
    j = next(j for j, (a, b) in enumerate(zip(draft, ref, strict=True)) if a != b)
    ctx = prompt + resp[:n_i]
    path = ctx[len(ctx) - m :] + ref[:j]
    mine_g = (REF["cached"]["response"], resp[:n_i])
    counts = [
      (_occurrences(c, path + [draft[j]]), _occurrences(c, path + [ref[j]]))
      for c in ((ctx,), mine_g)
    ]
    assert any(a == b > 0 for a, b in counts), (i, counts)
  assert len(ties) <= 2, ties  # arctic's history order and specdec's agree at every other step


def _stream_acceptance(drafter, params, prompt, resp, k, prompt_len=None):
  """Greedy verification against a recorded response (the simulator's loop) with `propose`."""
  seq = np.asarray(prompt + resp, np.int32)[None]
  state = jnp.asarray([len(prompt)])
  propose = jax.jit(lambda p, t, n, s: drafter.propose(p, s, Context(t, n), k, None, None)[0])
  n, accepted = 0, 0
  while n < len(resp):
    draft = np.asarray(propose(params, jnp.asarray(seq), jnp.asarray([len(prompt) + n]), state))
    acc = 0
    while acc < k and n + acc < len(resp) and draft[0, acc] == resp[n + acc]:
      acc += 1
    accepted, n = accepted + acc, n + acc + 1
  return accepted


def test_the_store_of_earlier_outputs_beats_prompt_lookup():
  # An agentic loop: request 2 writes what an earlier request wrote (the recorded edit), after a
  # prompt that does not contain it. Only the store has seen it.
  resp = REF["request"]["response"][:400]
  prompt = REF["request"]["prompt"][800:1000]
  with_store = suffix(max_depth=32, store_size=512, history=[resp])
  got = _stream_acceptance(with_store, with_store.params, prompt, resp, k=4)
  lookup = _stream_acceptance(ngram(1, 4), (), prompt, resp, k=4)
  empty = suffix(max_depth=32, store_size=512)
  alone = _stream_acceptance(empty, empty.params, prompt, resp, k=4)
  assert got > 2 * lookup and got > 2 * alone, (got, lookup, alone)
  assert got > 0.8 * 4 * (len(resp) / 5)  # most steps accept all 4 drafts


@pytest.fixture(scope="module")
def target():
  model = tiny_model()
  return specdec.Model(model.config.replace(eos_token_ids=()), model.params, None, model.dtype)


def test_greedy_identity_through_generate(target):
  prompts = [[3, 5, 7, 3, 5, 7, 3, 5], [1, 2, 3, 4, 1, 2]]
  base = specdec.generate(target, prompts, max_new_tokens=24)
  first = specdec.generate(target, prompts, max_new_tokens=24, drafter=suffix(store_size=64), k=4)
  assert first.tokens == base.tokens
  # The same requests again, their earlier outputs in the store: same tokens, more accepted.
  again = suffix(store_size=64, history=[t for t in base.tokens])
  second = specdec.generate(target, prompts, max_new_tokens=24, drafter=again, k=4)
  assert second.tokens == base.tokens
  assert second.stats["accepted"] > first.stats["accepted"]
  assert second.stats["tau"] > 3


def test_equal_options_share_compiled_steps():
  a, b = suffix(store_size=8, history=[[1, 2]]), suffix(store_size=8, history=[[3, 4, 5]])
  assert a == b and hash(a) == hash(b)
  assert not np.array_equal(a.params["tokens_g"], b.params["tokens_g"])


def test_the_store_keeps_the_newest_outputs_that_fit():
  tokens_g = suffix(store_size=5, history=[[1, 1, 1], [2, 2], [3, 3, 3]]).params["tokens_g"]
  assert np.asarray(tokens_g).tolist() == [2, 2, 3, 3, 3]


@pytest.mark.parametrize(
  "kw, needle",
  [
    (dict(store_size=0), "store_size=0"),
    (dict(max_depth=1), "max_depth=1"),
    (dict(min_token_prob=1.5), "min_token_prob=1.5"),
    (dict(max_spec_factor=-1.0), "max_spec_factor=-1.0"),
    (dict(max_tree_tokens=-1), "max_tree_tokens=-1"),
    (dict(store_size=2, history=[[1, 2, 3]]), "store_size=2"),
    (dict(history=[[1, -2]]), "negative token"),
  ],
)
def test_bad_options_are_refused_by_name(kw, needle):
  with pytest.raises(ValueError, match=needle):
    suffix(**kw)


def test_validate_refuses_a_match_longer_than_the_buffer_and_foreign_tokens():
  cfg = tiny_config()
  with pytest.raises(ValueError, match="max_depth=64 exceeds the token buffer's 32 slots"):
    suffix(max_depth=64).validate(cfg, 4, 32)
  with pytest.raises(ValueError, match="token 99, outside the target's vocabulary"):
    suffix(history=[[99]]).validate(cfg, 4, 512)
