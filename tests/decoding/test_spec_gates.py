"""Correctness gates of the draft-verify step: greedy identity, losslessness, Leviathan's law."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

import specdec
from specdec.drafters import draft_lm, ngram
from specdec.drafters.draft_lm import DraftLM
from specdec.ops import sampling as S
from tests.helpers import GOLDEN, tiny_model

# Rows of different lengths; the repeats give the n-gram drafter something to find.
PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9, 3], [1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 4]]
KS = (1, 2, 3, 4, 8, 16)


@pytest.fixture(scope="module")
def target():
  return tiny_model(seed=0)


@pytest.fixture(scope="module")
def baseline(target):
  return {b: specdec.generate(target, PROMPTS[:b], max_new_tokens=24).tokens for b in (1, 3)}


def _drafter(kind, target):
  if kind == "ngram":
    return ngram(min_n=1, max_n=3)
  # A draft model that is the target itself accepts almost everything; a different random one
  # almost nothing: the gate must hold at both ends.
  return draft_lm(target if kind == "draft_self" else tiny_model(seed=1))


@pytest.mark.parametrize("kind", ["ngram", "draft_self", "draft_other"])
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("B", [1, 3])
def test_greedy_is_token_identical_to_baseline(target, baseline, kind, k, B):
  out = specdec.generate(
    target, PROMPTS[:B], max_new_tokens=24, drafter=_drafter(kind, target), k=k
  )
  assert out.tokens == baseline[B]
  s = out.stats
  assert 1.0 <= s["tau"] <= k + 1
  assert sum(s["rows"]["proposed"]) == k * sum(s["rows"]["steps"])
  if kind == "draft_self":
    assert s["tau"] > 1 + 0.5 * k  # the gate is not passing by rejecting everything


def test_same_shape_baseline_agrees(target, baseline):
  # Verify width k+1 with every draft rejected: one token per step, same output in float32.
  out = specdec.generate(
    target, PROMPTS, max_new_tokens=24, drafter=ngram(), k=4, acceptance="reject"
  )
  assert out.tokens == baseline[3]
  assert out.stats["tau"] == 1.0


@pytest.mark.parametrize("name", ["qwen3_gqa", "llama_bias"])
@pytest.mark.parametrize("kind", ["ngram", "draft_self"])
def test_greedy_identity_on_golden_fixtures(name, kind):
  model = specdec.load(os.path.join(GOLDEN, name), dtype=jnp.float32)
  model = specdec.Model(model.config.replace(eos_token_ids=()), model.params, None, model.dtype)
  ref = np.load(os.path.join(GOLDEN, name, "reference.npz"))
  out = specdec.generate(
    model, ref["prompt"].tolist(), max_new_tokens=32, drafter=_drafter(kind, model), k=4
  )
  assert out.tokens[0] == ref["greedy"][0].tolist()


def test_rows_keep_their_own_lengths_and_acceptance(target):
  out = specdec.generate(target, PROMPTS, max_new_tokens=24, drafter=ngram(), k=4)
  rows = out.stats["rows"]
  assert len(set(rows["steps"])) > 1  # rows advanced at different rates in one batch
  hist = np.asarray(rows["accept_hist"])
  assert hist.sum((1, 2)).tolist() == rows["steps"]
  assert (hist.sum(1) * np.arange(5)).sum(-1).tolist() == rows["accepted"]


# --- Leviathan's law --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Corrupted(DraftLM):
  """The target as its own drafter, each draft replaced by a wrong token with probability 1 - a:
  under greedy verification every position is accepted i.i.d. with rate a."""

  rate: float = 1.0

  def propose(self, params, state, ctx, k, sampling, key):
    key, sub = jax.random.split(key)
    draft_BJ, q, state = super().propose(params, state, ctx, k, sampling, key)
    keep_BJ = jax.random.uniform(sub, draft_BJ.shape) < self.rate
    wrong_BJ = (draft_BJ + 1) % self.model.config.vocab_size
    return jnp.where(keep_BJ, draft_BJ, wrong_BJ), q, state


@pytest.mark.optimized
@pytest.mark.parametrize("a, k", [(0.5, 2), (0.7, 4), (0.9, 8)])
def test_tau_follows_leviathan(target, a, k):
  prompts = [[i % 60 + 1, (7 * i) % 60 + 1, 3] for i in range(128)]
  out = specdec.generate(
    target, prompts, max_new_tokens=256, drafter=Corrupted(model=target, rate=a), k=k, seed=k
  )
  expected = (1 - a ** (k + 1)) / (1 - a)
  assert abs(out.stats["tau"] - expected) / expected < 0.02, (out.stats["tau"], expected)
  assert abs(out.stats["predicted_tau"] - expected) / expected < 0.02


# --- Losslessness -----------------------------------------------------------------------------

V, PROMPT, N_SAMPLES = 12, [3, 7, 1], 60_000


@pytest.fixture(scope="module")
def small_vocab():
  kw = dict(
    vocab_size=V,
    hidden_size=16,
    intermediate_size=32,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    num_hidden_layers=1,
    max_position_embeddings=64,
  )
  return tiny_model(seed=2, scale=3.0, **kw), tiny_model(seed=3, scale=3.0, **kw)


def _exact_joint(model, s: S.Sampling):
  """P(t1, t2, t3) under the target alone, by enumerating every continuation (no EOS)."""
  seqs = np.array([PROMPT + [a, b] for a in range(V) for b in range(V)], np.int32)
  p = np.asarray(S.probs(model.logits(seqs)[:, len(PROMPT) - 1 :], s), np.float64)
  # Rows are ordered a * V + b: P(t1), P(t2 | a) [a, t2], P(t3 | a, b) [a, b, t3].
  p1, p2, p3 = p[0, 0], p[::V, 1], p[:, 2].reshape(V, V, V)
  return p1[:, None, None] * p2[:, :, None] * p3


def _sampled_joint(model, drafter, s, mode, k):
  counts = np.zeros((V, V, V))
  for seed in range(N_SAMPLES // 10_000):
    out = specdec.generate(
      model,
      [PROMPT] * 10_000,
      max_new_tokens=3,
      temperature=s.temperature,
      top_k=s.top_k,
      top_p=s.top_p,
      seed=seed,
      drafter=drafter,
      k=k,
      acceptance=mode,
    )
    t = np.asarray(out.tokens)
    np.add.at(counts, (t[:, 0], t[:, 1], t[:, 2]), 1)
  return counts


def _gate(counts, p):
  """Chi-square p-value of the joint of the first three tokens; cells with expected count < 5 are
  pooled, and a sample in a cell of probability 0 fails outright."""
  n = counts.sum()
  e = p.ravel() * n
  assert counts.ravel()[e == 0].sum() == 0, "sampled a token the transforms excluded"
  big = e >= 5
  counts, e, big = counts.ravel()[e > 0], e[e > 0], big[e > 0]
  obs, exp = counts[big], e[big]
  if (~big).any():
    obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, e[~big].sum())
  pval = sps.chisquare(obs, exp * n / exp.sum()).pvalue  # float32 probabilities sum to 1 +- 1e-7
  return pval


def _tv(counts, p):
  """Largest total variation of a one-token marginal, and the bound it must stay under.

  Bretagnolle-Huber-Carol: P(TV(p_hat, p) >= eps) <= 2^C exp(-2 N eps^2), so with C cells and
  failure probability delta, eps = sqrt((C ln 2 + ln(1/delta)) / (2N)); here C = V, delta = 1e-4
  (N = 60,000, V = 12: eps = 0.0166).
  """
  n = counts.sum()
  eps = np.sqrt((V * np.log(2) + np.log(1e4)) / (2 * n))
  tvs = [
    0.5
    * np.abs(
      counts.sum(axis=tuple(j for j in range(3) if j != i)) / n
      - p.sum(axis=tuple(j for j in range(3) if j != i))
    ).sum()
    for i in range(3)
  ]
  return max(tvs), eps


CASES = [
  ("onehot", 1.0, 0, 1.0),
  ("onehot", 0.6, 8, 0.9),
  ("fullq", 1.0, 0, 1.0),
  ("fullq", 0.6, 8, 0.9),
]


@pytest.mark.parametrize("mode, temperature, top_k, top_p", CASES)
def test_sampling_is_lossless(small_vocab, mode, temperature, top_k, top_p):
  target, draft = small_vocab
  s = S.Sampling(temperature, top_k, top_p)
  counts = _sampled_joint(target, draft_lm(draft), s, mode, k=2)
  p = _exact_joint(target, s)
  pval, (tv, eps) = _gate(counts, p), _tv(counts, p)
  assert pval > 1e-4 and tv < eps, (pval, tv, eps)


def test_negative_control_biased_acceptance_fails(small_vocab, monkeypatch):
  """Accepting drafts with probability sqrt(p) instead of p over-produces draft tokens."""
  from specdec.decoding import step as step_lib

  def biased(key, logits_BTV, draft_BJ, q, s, mode, reject=False):
    B, k = draft_BJ.shape
    p_BTV = S.probs(logits_BTV, s)
    p_draft_BJ = jnp.take_along_axis(p_BTV[:, :k], draft_BJ[..., None], -1)[..., 0]
    key_u, key_s = jax.random.split(key)
    ok_BJ = jax.random.uniform(key_u, (B, k)) < jnp.sqrt(p_draft_BJ)
    n_acc_B = jnp.sum(jnp.cumprod(ok_BJ, -1), -1).astype(jnp.int32)
    token_B = S.sample(key_s, p_BTV[jnp.arange(B), n_acc_B])
    out_BT = jnp.concatenate([draft_BJ, jnp.zeros((B, 1), jnp.int32)], -1)
    return n_acc_B, out_BT.at[jnp.arange(B), n_acc_B].set(token_B)

  monkeypatch.setattr(step_lib, "accept", biased)
  target, draft = small_vocab
  s = S.Sampling(1.0, 0, 1.0)
  counts = _sampled_joint(target, draft_lm(draft), s, "onehot", k=2)
  assert _gate(counts, _exact_joint(target, s)) < 1e-4
