"""The DSpark objective of specdec.training.block: the teacher-forced Markov bias is the one the
drafter's sequential walk adds at inference when the predecessors agree, for every head type and
both anchor conventions; the total-variation and confidence terms behave as defined."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.drafters.block import block
from specdec.drafters.block_model import BlockDraft
from specdec.ops.sampling import Sampling
from specdec.training.block import make_loss, markov_bias, teacher_prev
from tests.helpers import tiny_model


@pytest.fixture(scope="module")
def target():
  return tiny_model(seed=0)


def dspark(target, kind="vanilla", from_anchor=True, confidence=True):
  return block(
    target, seed=1, num_layers=1, block_size=5, target_layer_ids=(0, 1),
    sample_from_anchor=from_anchor, markov_rank=8, markov_head_type=kind,
    confidence_head=confidence,
  )  # fmt: skip


@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("from_anchor", [True, False])
def test_teacher_forced_bias_is_the_walks_bias(target, kind, from_anchor):
  d = dspark(target, kind, from_anchor)
  B, b, D = 3, d.cfg.block_size, target.config.hidden_size
  h_BbD = jax.random.normal(jax.random.key(0), (B, b, D))
  token_B = jnp.array([3, 17, 40], jnp.int32)
  drafts_BP, logits_BPV = d._markov_walk(d.params, h_BbD, token_B, Sampling(), jax.random.key(1))
  first = b - d.cfg.drafts_per_forward
  # Labels equal to the walk's own drafts: the teacher's predecessors are the walk's.
  prev_BAb = teacher_prev(token_B[:, None], drafts_BP[:, None], first)
  bias_BAPV = markov_bias(BlockDraft(d.cfg), {"params": d.params["draft"]}, h_BbD[:, None],
                          prev_BAb, first)  # fmt: skip
  want_BPV = d.draft_logits(d.params, h_BbD[:, first:], bias_BAPV[:, 0])
  np.testing.assert_allclose(want_BPV, logits_BPV, rtol=1e-5, atol=1e-5)
  # A predecessor off by one row changes the bias: the alignment is what is being tested.
  shifted = markov_bias(BlockDraft(d.cfg), {"params": d.params["draft"]}, h_BbD[:, None],
                        jnp.roll(prev_BAb, 1, -1), first)  # fmt: skip
  assert not np.allclose(shifted, bias_BAPV, atol=1e-4)


def test_dspark_objective_terms(target):
  d = dspark(target, "gated")
  tokens = jax.random.randint(jax.random.key(2), (2, 16), 1, 60)
  loss_fn = make_loss(target, d.cfg, anchors=4)
  frozen = {"target": target.params}
  params = jax.tree.map(jnp.asarray, d.params["draft"])
  loss, m = jax.jit(loss_fn)({"params": params}, frozen, tokens, jax.random.key(3))
  assert 0 <= m["l1_loss"] <= 2 and 0 < m["confidence_loss"]
  assert 1 <= m["tau_probabilistic"] <= 1 + d.cfg.drafts_per_forward
  # The weights as defined: 0.1 CE + 0.9 TV + 1.0 BCE.
  want = 0.1 * m["block_loss"] + 0.9 * m["l1_loss"] + m["confidence_loss"]
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  plain = make_loss(target, dspark(target, confidence=False).cfg, anchors=4, ce_weight=1.0,
                    l1_weight=0.0)  # fmt: skip
  p2 = {k: v for k, v in params.items() if k != "confidence_head"}
  loss2, m2 = jax.jit(plain)({"params": p2}, frozen, tokens, jax.random.key(3))
  assert "confidence_loss" not in m2
  np.testing.assert_allclose(loss2, m2["block_loss"], rtol=1e-6)


def test_a_reduced_vocabulary_is_refused_by_name(target):
  cfg = dspark(target).cfg.replace(draft_vocab_size=16)
  with pytest.raises(ValueError, match="draft_vocab_size 16"):
    make_loss(target, cfg)
