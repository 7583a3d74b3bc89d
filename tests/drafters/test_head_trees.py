"""Tree drafting with the chained heads (MTP, EAGLE-3): greedy identity with the no-draft
baseline, the chain-shaped tree as the k-chain (which checks commit_tree's head state), deep
accepted paths, and lossless tree sampling."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.decoding.generate import cache_slots
from specdec.decoding.step import StepConfig, prefill, step
from specdec.decoding.tree import tree
from specdec.drafters import eagle3, mtp
from specdec.model import forward
from specdec.ops.sampling import Sampling
from tests.decoding import test_spec_gates as gates
from tests.decoding import test_tree
from tests.decoding.test_tree import PROMPTS
from tests.helpers import tiny_model

TREES = {
  "chain": test_tree.TREES["chain"],
  "bushy": test_tree.TREES["bushy"],
  "deep": [(0,), (1,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0), (0, 1), (1, 0)],
}
HEADS = {"mtp": mtp.mtp, "eagle3": eagle3.eagle3}
MAX_NEW = 20


@pytest.fixture(scope="module")
def target():
  return tiny_model(num_hidden_layers=6)  # EAGLE-3's default taps need distinct layers


@pytest.fixture(scope="module")
def baseline(target):
  return specdec.generate(target, PROMPTS, max_new_tokens=MAX_NEW).tokens


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("shape", list(TREES))
@pytest.mark.parametrize("name", list(HEADS))
def test_generate_with_a_tree_gives_the_baseline_greedy_tokens(
  target, baseline, name, shape, batch
):
  got = specdec.generate(
    target, PROMPTS[:batch], max_new_tokens=MAX_NEW, drafter=HEADS[name](target), tree=TREES[shape]
  )
  assert got.tokens == baseline[:batch]
  t = tree(TREES[shape])
  assert (got.stats["k"], got.stats["verify_width"]) == (t.depth, t.size)


@pytest.mark.parametrize("name", list(HEADS))
def test_a_chain_shaped_tree_is_the_chain(target, name):
  """Rank-0 children are the head's argmax drafts and commit_tree re-runs the chain commit on the
  accepted path, so the chain tree reproduces the k-chain step for step: any difference in the
  head's state after a commit would change later drafts, hence the acceptance histogram."""
  kw = dict(max_new_tokens=24, drafter=HEADS[name](target, seed=3))
  chain = specdec.generate(target, PROMPTS, k=3, **kw)
  as_tree = specdec.generate(target, PROMPTS, tree=TREES["chain"], **kw)
  assert as_tree.tokens == chain.tokens
  assert as_tree.stats["accept_hist"] == chain.stats["accept_hist"]
  assert as_tree.stats["accepted"] > 0  # the comparison saw accepted drafts


def test_a_head_that_drafts_what_the_target_says_accepts_deep_paths(target):
  """After its first token this target repeats 37 on this prompt; an EAGLE-3 head whose one-token
  draft vocabulary is 37 (d2t maps draft id 0 there) drafts it at every node, so whole depth-5
  paths are accepted and their commits run."""
  prompt = [[3] * 18 + [11]]
  cfg = eagle3.make_config(target.config, draft_vocab_size=1)
  drafter = eagle3.eagle3(target, config=cfg, draft_ids=np.asarray([37]))
  deep = [(0,) * d for d in range(1, 6)]
  base = specdec.generate(target, prompt, max_new_tokens=MAX_NEW)
  assert base.tokens[0][1:10] == [37] * 9
  got = specdec.generate(target, prompt, max_new_tokens=MAX_NEW, drafter=drafter, tree=deep)
  assert got.tokens == base.tokens
  hist = np.asarray(got.stats["accept_hist"]).reshape(-1, 6).sum(0)
  assert hist[5] >= 2 and got.stats["acceptance_rate"] > 0.5


def test_a_node_with_more_children_than_draftable_tokens_is_refused(target):
  cfg = eagle3.make_config(target.config, draft_vocab_size=1)
  drafter = eagle3.eagle3(target, config=cfg, draft_ids=np.asarray([37]))
  with pytest.raises(ValueError, match="2 children exceeds the 1 draftable tokens"):
    specdec.generate(target, PROMPTS, max_new_tokens=8, drafter=drafter, tree=TREES["bushy"][:2])


small_vocab = gates.small_vocab  # the gate's 12-token target


def test_tree_sampling_with_a_head_is_lossless(small_vocab):
  """The tree-sampling gate of test_tree.py with an MTP head drafting the wide tree."""
  target, _ = small_vocab
  s = Sampling(1.0, 0, 1.0)
  counts = test_tree._tree_joint(target, mtp.mtp(target, seed=1), s)
  p = gates._exact_joint(target, s)
  pval, (tv, eps) = gates._gate(counts, p), gates._tv(counts, p)
  assert pval > 1e-4 and tv < eps, (pval, tv, eps)


def test_after_a_tree_step_the_head_state_is_teacher_forced_on_the_committed_sequence(target):
  """A full binary tree drafts both of a two-token draft vocabulary at every node, so the
  target's run of 37s is accepted along a path whose nodes are not 0, 1, 2, 3 (depth 2 is a node
  in 3..6): the head's cache and output at pair L-2 must be those of the committed sequence
  under the true features."""
  cfg = eagle3.make_config(target.config, draft_vocab_size=2)
  drafter = eagle3.eagle3(target, config=cfg, draft_ids=np.asarray([5, 37]), seed=2)
  t = tree([p for d in range(1, 4) for p in itertools.product((0, 1), repeat=d)])
  sc = StepConfig(target.config, jnp.float32, drafter, t.depth, Sampling(), "greedy", (), tree=t)
  prompt = [3] * 18 + [11]
  S = cache_slots(32, 16, t.size - 1)
  prompt_BT = jnp.zeros((1, 32), jnp.int32).at[0, : len(prompt)].set(jnp.asarray(prompt))
  args = (jnp.asarray([len(prompt)]), jnp.asarray([16]), jax.random.key(0))
  st = prefill(target.params, drafter.params, prompt_BT, *args, sc, S)
  st = jax.jit(step, static_argnames="sc")(target.params, drafter.params, st, sc)
  L = int(st.lengths[0])
  assert int(st.accepted[0]) == t.depth
  seq_1L = jnp.asarray(st.tokens[:, :L])
  out = forward(target.params, seq_1L, target.config, jnp.float32, drafter.taps)
  h_1LD = drafter.features(drafter.params, out)
  want_1LD, want = drafter.teacher_forced(drafter.params, h_1LD, seq_1L, S)
  np.testing.assert_allclose(st.draft.h_BD[0], want_1LD[0, L - 2], rtol=1e-4, atol=1e-4)
  for got, ref in zip(st.draft.cache.k + st.draft.cache.v, want.k + want.v, strict=True):
    np.testing.assert_allclose(got[0, : L - 1], ref[0, : L - 1], rtol=1e-4, atol=1e-4)
