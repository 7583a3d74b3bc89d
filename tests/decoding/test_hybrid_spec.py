"""Speculation over a hybrid target: the recurrent state is settled at the emitted count.

Greedy output of every drafter that runs on it (oracle, n-gram, suffix, draft LM, MTP, EAGLE-3,
block) equals plain decoding at k up to 16 and B in {1, 3} (rows of different lengths, so prefill
padding and per-row state selection both count), and sampling stays lossless (the step's
statistical gate, on a small-vocabulary hybrid).
"""

import numpy as np
import pytest

import specdec
from specdec.drafters import block as block_lib
from specdec.drafters import draft_lm, ngram, suffix
from specdec.drafters import mtp as mtp_lib
from specdec.drafters.eagle3 import eagle3, to_hf_dict
from specdec.drafters.oracle import oracle
from specdec.models.config import ModelConfig
from specdec.ops import sampling as S
from tests.decoding import test_spec_gates as gates
from tests.helpers import tiny_hybrid_model, tiny_model

PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9, 3], [1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 4]]
NEW = 24


@pytest.fixture(scope="module")
def target():
  return tiny_hybrid_model(seed=2, scale=3.0)  # GDN, then attention with routed experts


@pytest.fixture(scope="module")
def baseline(target):
  return {b: specdec.generate(target, PROMPTS[:b], max_new_tokens=NEW).tokens for b in (1, 3)}


def _oracle(target, baseline, B, miss):
  """Drafts the known greedy continuation, each token wrong with probability `miss`: every
  accepted count from 0 to k occurs, so every settled slot is exercised."""
  rows = [p + t for p, t in zip(PROMPTS[:B], baseline[B], strict=True)]
  return oracle(rows, target.config.vocab_size, miss=miss)


def test_baseline_is_not_degenerate(baseline):
  assert all(len(set(row)) >= 10 for row in baseline[3])


@pytest.mark.parametrize("k, B", [(1, 3), (8, 3), (16, 1)])
def test_greedy_identity_with_every_accepted_count(target, baseline, k, B):
  out = specdec.generate(
    target, PROMPTS[:B], max_new_tokens=NEW, drafter=_oracle(target, baseline, B, 0.3), k=k
  )
  assert out.tokens == baseline[B]
  hist = np.asarray(out.stats["rows"]["accept_hist"]).sum((0, 1))
  assert hist[0] > 0 and (k == 1 or hist[1:k].sum() > 0)  # rejections and partial accepts


def test_greedy_identity_when_every_draft_is_accepted(target, baseline):
  out = specdec.generate(
    target, PROMPTS, max_new_tokens=NEW, drafter=_oracle(target, baseline, 3, 0.0), k=8
  )
  assert out.tokens == baseline[3]
  assert out.stats["tau"] > 5


LIBRARY = {
  "ngram": lambda t: ngram(1, 3),
  "draft_lm": lambda t: draft_lm(tiny_model(seed=1)),
  # Untrained heads over the hybrid's features: they rarely agree, the gate must still hold.
  "mtp": lambda t: mtp_lib.mtp(t),
  "block": lambda t: block_lib.block(t),
}


@pytest.mark.parametrize(
  "kind, k, B",
  [("ngram", 16, 3), ("draft_lm", 4, 1), ("mtp", 16, 1), ("mtp", 16, 3), ("block", 8, 1)],
)
def test_greedy_identity_for_the_library_drafters(target, baseline, kind, k, B):
  drafter = LIBRARY[kind](target)
  out = specdec.generate(target, PROMPTS[:B], max_new_tokens=NEW, drafter=drafter, k=k)
  assert out.tokens == baseline[B]


def test_greedy_identity_for_suffix_decoding(target, baseline):
  """The store holds the answers, so long runs are drafted and accepted: every count 0..k."""
  drafter = suffix(store_size=64, history=baseline[3])
  out = specdec.generate(target, PROMPTS, max_new_tokens=NEW, drafter=drafter, k=8)
  assert out.tokens == baseline[3]
  hist = np.asarray(out.stats["rows"]["accept_hist"]).sum((0, 1))
  assert (hist > 0).all(), hist


def test_greedy_identity_for_an_eagle3_head():
  """EAGLE-3 taps three distinct layers, more than the 2-layer target has: a 3-layer hybrid.
  15 new tokens: below one 16-step chunk, so each decode compiles one chunk size."""
  layers = ["linear_attention", "linear_attention", "full_attention"]
  deep = tiny_hybrid_model(seed=2, scale=3.0, num_hidden_layers=3, layer_types=layers)
  want = specdec.generate(deep, PROMPTS, max_new_tokens=15).tokens
  assert all(len(set(row)) >= 8 for row in want)  # not degenerate
  head = eagle3(deep)  # untrained, over taps of both layer kinds
  assert head.taps == (0, 1, 2)
  # The head is a dense llama layer: nothing of the target's layer schedule is saved with it.
  saved = to_hf_dict(head.spec)
  assert type(head.spec.head) is ModelConfig and saved["model_type"] == "llama"
  assert not {"layer_types", "linear_num_value_heads", "num_experts"} & set(saved)
  out = specdec.generate(deep, PROMPTS, max_new_tokens=15, drafter=head, k=8)
  assert out.tokens == want


def test_same_shape_baseline_and_chunked_prefill_agree(target, baseline):
  out = specdec.generate(
    target, PROMPTS, max_new_tokens=NEW, drafter=ngram(), k=4, acceptance="reject",
    prefill_chunk=16, min_bucket=32,
  )  # fmt: skip
  assert out.tokens == baseline[3]
  assert out.stats["tau"] == 1.0


@pytest.fixture(scope="module")
def small_vocab_hybrid():
  kw = dict(vocab_size=gates.V, hidden_size=16, intermediate_size=32, max_position_embeddings=64)
  dense = dict(kw, num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_hidden_layers=1)
  return tiny_hybrid_model(seed=2, scale=3.0, **kw), tiny_model(seed=3, scale=3.0, **dense)


@pytest.mark.parametrize("mode, temperature, top_k, top_p", [("onehot", 0.6, 8, 0.9)])
def test_sampling_is_lossless_on_a_hybrid(small_vocab_hybrid, mode, temperature, top_k, top_p):
  target, draft = small_vocab_hybrid
  s = S.Sampling(temperature, top_k, top_p)
  counts = gates._sampled_joint(target, draft_lm(draft), s, mode, k=2)
  p = gates._exact_joint(target, s)
  pval, (tv, eps) = gates._gate(counts, p), gates._tv(counts, p)
  assert pval > 1e-4 and tv < eps, (pval, tv, eps)


def test_a_hybrid_draft_model_is_refused_before_compiling(target):
  with pytest.raises(ValueError, match="draft_lm: a qwen3_next draft model keeps recurrent state"):
    specdec.generate(tiny_model(), PROMPTS[:1], max_new_tokens=4, drafter=draft_lm(target), k=2)
