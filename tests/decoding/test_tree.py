"""Static draft trees: parsing and validation, the tree-masked verify, path acceptance, the K/V
moves, tree drafting, and greedy identity of generate(tree=) with every tree-drafting drafter."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.decoding import generate as generate_lib
from specdec.decoding.accept import accept_tree
from specdec.decoding.generate import cache_slots
from specdec.decoding.step import StepConfig, prefill, step
from specdec.decoding.tree import Tree, binary_paths, tree
from specdec.drafters import draft_lm, ngram
from specdec.drafters.base import NO_TOKEN, Context
from specdec.drafters.block import block
from specdec.models.transformer import KVCache
from specdec.ops.attention import TreeMask
from specdec.ops.sampling import Sampling
from tests.decoding import test_spec_gates as gates
from tests.helpers import tiny_hybrid_model, tiny_model

WIDE = [(0,), (1,), (0, 0), (0, 1), (1, 0)]
PROMPTS = [
  [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3],
  [9, 8],
  [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 11],
]
TREES = {
  "chain": [(0,), (0, 0), (0, 0, 0)],
  "wide": WIDE,
  "bushy": [(0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0), (0, 0, 1)],
}


@pytest.fixture(scope="module")
def model():
  return tiny_model()


def test_nodes_are_laid_out_breadth_first_with_parents_depths_and_masks():
  t = tree([(1, 0), (0, 1), (0,), (0, 0), (1,)])  # any order in, (depth, path) order out
  assert t.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0))
  assert (t.size, t.depth) == (6, 2)
  assert t.parents.tolist() == [0, 0, 0, 1, 1, 2]
  assert t.depths.tolist() == [0, 1, 1, 2, 2, 2]
  assert t.children.tolist() == [[1, 2], [3, 4], [5, -1], [-1, -1], [-1, -1], [-1, -1]]
  assert t.path_to.tolist() == [[0, 0, 0], [0, 1, 1], [0, 2, 2], [0, 1, 3], [0, 1, 4], [0, 2, 5]]
  want = np.eye(6, dtype=bool)
  want[1:, 0] = True
  want[[3, 4], 1] = True
  want[5, 2] = True
  np.testing.assert_array_equal(t.ancestors, want)
  assert t.at_depth(2).tolist() == [3, 4, 5]
  assert hash(t) == hash(tree(WIDE)) and t == tree(WIDE)  # a static argument: by value


@pytest.mark.parametrize(
  "paths, fragment",
  [
    ([(0,), (0, 1)], r"\(0, 1\) has no sibling \(0, 0\)"),
    ([(0,), (1, 0)], r"\(1, 0\) has no parent \(1,\)"),
    ([(0,), (0,)], r"\(0,\) is listed twice"),
    ([(0,), ()], "empty path"),
    ([(0,), (-1,)], "negative"),
    ([(0,), (0.5,)], "integer child ranks"),
    ([0, 1], "integer child ranks"),
    ([], "PATHS is empty"),
    ([(i,) for i in range(130)], "130 nodes exceed the verify width limit of 128"),
  ],
)
def test_a_path_list_that_is_not_a_tree_is_refused_by_name(paths, fragment):
  with pytest.raises(ValueError, match=fragment):
    tree(paths)


@pytest.mark.parametrize(
  "kw, fragment",
  [
    (dict(drafter=ngram(), tree=WIDE, k=3), "k=3 disagrees with the tree's depth 2"),
    (dict(drafter=ngram(), tree=[(0,), (0, 2)]), "no sibling"),
    (dict(tree=WIDE), "needs a drafter"),
    (dict(drafter=ngram(), tree=WIDE, temperature=0.8, acceptance="fullq"), "'greedy' or 'onehot'"),
    (dict(drafter=ngram(), tree=[(i,) for i in range(100)]), "a tree of 101 nodes.*cache room"),
    (dict(drafter=ngram(), tree=[(0,) * d for d in range(1, 60)], max_slots=64), "cache room"),
  ],
)
def test_bad_tree_arguments_are_refused_before_compiling(model, kw, fragment):
  with pytest.raises(ValueError, match=fragment):
    specdec.generate(model, PROMPTS, max_new_tokens=400, **kw)


def test_a_drafter_that_cannot_draft_trees_says_so():
  target = tiny_model()
  drafter = block(target, num_layers=1, block_size=4, target_layer_ids=(0, 1))
  with pytest.raises(ValueError, match=f"drafter '{drafter.name}' cannot draft trees"):
    specdec.generate(target, PROMPTS, max_new_tokens=8, drafter=drafter, tree=WIDE)


def test_a_hybrid_target_refuses_trees():
  target = tiny_hybrid_model(seed=2, scale=3.0)
  with pytest.raises(ValueError, match="recurrent state"):
    specdec.generate(target, PROMPTS, max_new_tokens=8, drafter=ngram(), tree=WIDE)


def test_a_tree_verify_gives_each_node_the_logits_of_its_own_path(model):
  """The verify forward over root + nodes under the tree mask, at positions root + depth, equals a
  plain causal forward over the committed prefix followed by the node's path, node by node."""
  t = tree(TREES["bushy"])
  prefix = PROMPTS[0]
  rng = np.random.default_rng(0)
  nodes = rng.integers(0, model.config.vocab_size, t.size - 1).tolist()
  tokens_n = [prefix[-1], *nodes]
  L, S = len(prefix), 64
  module = model.module
  cache = KVCache.zeros(model.config, 1, S, jnp.float32)
  pos = jnp.arange(L - 1)[None]
  cache = module.apply(model.params, jnp.asarray([prefix[:-1]]), pos, cache).cache
  root = jnp.asarray([L - 1])
  mask = TreeMask(root, np.arange(t.size), t.ancestors)
  out = module.apply(
    model.params, jnp.asarray([tokens_n]), root[:, None] + jnp.asarray(t.depths)[None], cache,
    tree=mask,
  )  # fmt: skip
  for i in range(t.size):
    path = [tokens_n[j] for j in t.path_to[i, 1 : t.depths[i] + 1]]
    want = model.logits(np.asarray([prefix + path]))[0, -1]
    np.testing.assert_allclose(out.logits[0, i], want, rtol=2e-4, atol=2e-4)


def _logits_preferring(target_n, V=16):
  """[1, n, V] logits whose argmax at node i is target_n[i]."""
  return jax.nn.one_hot(jnp.asarray([target_n]), V) * 5.0


def test_greedy_tree_acceptance_takes_the_deepest_agreeing_path():
  t = tree(WIDE)  # nodes 1:(0,) 2:(1,) 3:(0,0) 4:(0,1) 5:(1,0)
  # The target says 7 after the root, 4 after node 2 and 9 after node 1. Node 2 (token 7) and
  # its child node 5 (token 4) agree: depth 2. Node 1 (token 3) disagrees at once.
  logits = _logits_preferring([7, 9, 4, 0, 0, 0])
  draft = jnp.asarray([[3, 7, 9, 9, 4]])
  n_acc, out, path = accept_tree(None, logits, draft, t, Sampling(), "greedy")
  assert int(n_acc[0]) == 2
  assert path[0].tolist() == [0, 2, 5]
  assert out[0].tolist() == [7, 4, 0]  # the path's tokens, then the target's after node 5
  # Both depth-1 nodes agree and only node 1's subtree goes deeper: its child of rank 1 wins.
  logits = _logits_preferring([7, 5, 4, 0, 0, 0])
  draft = jnp.asarray([[7, 7, 6, 5, 6]])
  n_acc, out, path = accept_tree(None, logits, draft, t, Sampling(), "greedy")
  assert (int(n_acc[0]), path[0].tolist(), out[0].tolist()) == (2, [0, 1, 4], [7, 5, 0])
  # Nothing agrees: the target's own token after the root. With reject, the same whatever agrees.
  n_acc, out, _ = accept_tree(None, logits, jnp.asarray([[1, 1, 1, 1, 1]]), t, Sampling(), "greedy")
  assert (int(n_acc[0]), int(out[0, 0])) == (0, 7)
  n_acc, out, _ = accept_tree(None, logits, draft, t, Sampling(), "greedy", reject=True)
  assert (int(n_acc[0]), int(out[0, 0])) == (0, 7)


def test_an_unfilled_node_is_never_accepted():
  # Node 1 is NO_TOKEN: greedy never matches it, and the onehot walk skips it even where the
  # target puts all its mass on the token it is fed as (0) or on the last id (a negative index).
  t = tree(WIDE)
  draft = jnp.asarray([[NO_TOKEN, 7, NO_TOKEN, NO_TOKEN, 4]])
  for target_tok in (0, 15):
    logits = _logits_preferring([target_tok, 0, 4, 0, 0, 0]) * 100.0
    for mode in ("greedy", "onehot"):
      s = Sampling() if mode == "greedy" else Sampling(1.0, 0, 1.0)
      n_acc, out, path = accept_tree(jax.random.key(0), logits, draft, t, s, mode)
      assert int(n_acc[0]) == 0 and int(out[0, 0]) == target_tok, (mode, target_tok)
  # Node 2 (7) and its child node 5 (4) agree; node 1 beside them is unfilled.
  logits = _logits_preferring([7, 0, 4, 0, 0, 0]) * 100.0
  n_acc, out, path = accept_tree(
    jax.random.key(0), logits, draft, t, Sampling(1.0, 0, 1.0), "onehot"
  )
  assert (int(n_acc[0]), path[0].tolist(), out[0].tolist()[:2]) == (2, [0, 2, 5], [7, 4])


def test_equal_siblings_resolve_to_the_first_in_node_order():
  t = tree(WIDE)
  logits = _logits_preferring([7, 5, 5, 0, 0, 0])
  n_acc, _, path = accept_tree(
    None, logits, jnp.asarray([[7, 7, 5, 6, 5]]), t, Sampling(), "greedy"
  )
  assert int(n_acc[0]) == 2 and path[0].tolist() == [0, 1, 3]


def test_after_a_tree_step_the_cache_holds_the_committed_sequence(model):
  """The accepted nodes' K/V moved to their sequence slots: every committed slot's K/V equals a
  plain forward over the committed tokens (the target as its own draft LM accepts a full path)."""
  t = tree(TREES["bushy"])
  sc = StepConfig(model.config, jnp.float32, draft_lm(model), t.depth, Sampling(), "greedy", (),
                  tree=t)  # fmt: skip
  prompt = PROMPTS[0]
  T, S = 32, cache_slots(32, 16, t.size - 1)
  prompt_BT = jnp.zeros((1, T), jnp.int32).at[0, : len(prompt)].set(jnp.asarray(prompt))
  args = (jnp.asarray([len(prompt)]), jnp.asarray([16]), jax.random.key(0))
  st = prefill(model.params, model.params, prompt_BT, *args, sc, S)
  st = jax.jit(step, static_argnames="sc")(model.params, model.params, st, sc)
  L = int(st.lengths[0])
  assert L == len(prompt) + 1 + t.depth + 1  # the prefill's token, the full path and the bonus
  seq = np.asarray(st.tokens[0, :L])
  ref = model.module.apply(
    model.params,
    jnp.asarray([seq]),
    jnp.arange(L)[None],
    KVCache.zeros(model.config, 1, S, jnp.float32),
  ).cache
  # The newest token's K/V is written by the next verify; every slot before it is final.
  for got, want in zip(st.cache.k + st.cache.v, ref.k + ref.v, strict=True):
    np.testing.assert_allclose(got[0, : L - 1], want[0, : L - 1], rtol=1e-4, atol=1e-4)


def test_ngram_tree_children_are_distinct_continuations_longest_then_latest():
  # Context ... 5 9 | 5 8 | 4 5 7 | 4 5: the suffix "4 5" was followed by 7; "5" alone by 7, 8, 9
  # (latest first). Rank 0 comes from the longest match, ranks 1, 2 from the shorter one.
  ctx_tokens = [5, 9, 5, 8, 4, 5, 7, 4, 5]
  tokens = jnp.zeros((1, 16), jnp.int32).at[0, : len(ctx_tokens)].set(jnp.asarray(ctx_tokens))
  ctx = Context(tokens, jnp.asarray([len(ctx_tokens)]))
  t = tree([(0,), (1,), (2,), (3,), (0, 0)])
  draft, _ = ngram(min_n=1, max_n=2).propose_tree((), (), ctx, t, Sampling(), None)
  # Ranks 0..2 of the root: 7, 8, 9; rank 3: none left (NO_TOKEN, never accepted). Node (0, 0)
  # continues "5 7": after "5 7" nothing, after "7" came "4".
  assert draft[0].tolist() == [7, 8, 9, NO_TOKEN, 4]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("shape", list(TREES))
@pytest.mark.parametrize("name", ["ngram", "draft_lm", "self"])
def test_generate_with_a_tree_gives_the_baseline_greedy_tokens(model, name, shape, batch):
  drafter = {
    "ngram": lambda: ngram(),
    "draft_lm": lambda: draft_lm(tiny_model(seed=1)),
    "self": lambda: draft_lm(model),  # every path accepted: the K/V moves are exercised fully
  }[name]()
  prompts = PROMPTS[:batch]
  base = specdec.generate(model, prompts, max_new_tokens=20)
  got = specdec.generate(model, prompts, max_new_tokens=20, drafter=drafter, tree=TREES[shape])
  assert got.tokens == base.tokens
  t = tree(TREES[shape])
  assert (got.stats["k"], got.stats["verify_width"]) == (t.depth, t.size)
  assert got.stats["tree"] == [list(p) for p in t.paths]
  if name == "self":
    assert got.stats["acceptance_rate"] == 1.0


def test_a_chain_shaped_tree_is_the_chain(model):
  """draft_lm's rank-0 children are its argmax drafts, so the chain tree reproduces the k-chain
  step for step: the same tokens and the same acceptance histogram."""
  drafter = draft_lm(tiny_model(seed=2, scale=3.0))
  kw = dict(max_new_tokens=24, drafter=drafter)
  chain = specdec.generate(model, PROMPTS, k=3, **kw)
  as_tree = specdec.generate(model, PROMPTS, tree=TREES["chain"], **kw)
  assert as_tree.tokens == chain.tokens
  assert as_tree.stats["accept_hist"] == chain.stats["accept_hist"]
  assert as_tree.stats["accepted"] > 0  # the comparison saw accepted drafts


def test_a_wide_ngram_tree_accepts_more_per_step_than_the_chain_of_its_depth(model):
  """A prompt whose n-grams branch ("1 2" is followed by 3 and by 4): a chain has to bet on one
  continuation, a tree verifies both."""
  prompt = [1, 2, 3, 5, 1, 2, 4, 6, 1, 2, 3, 5, 1, 2, 4, 6, 1, 2, 3, 5, 1, 2, 4, 6] * 2
  kw = dict(max_new_tokens=40, drafter=ngram(max_n=2))
  wide = [(0,), (1,), (2,), (0, 0), (1, 0), (2, 0), (0, 0, 0), (1, 0, 0), (2, 0, 0)]
  chain = specdec.generate(model, [prompt], k=3, **kw).stats
  got = specdec.generate(model, [prompt], tree=wide, **kw).stats
  assert got["tau_accepted"] > chain["tau_accepted"]


def test_compile_ahead_builds_what_a_tree_generate_runs(model):
  # Shapes no other test uses (bucket 32, 11 new tokens: 64 cache slots), so nothing is cached
  # in memory. A generate of 40 tokens (128 slots: other executables) first compiles the small
  # eager ops, shaped by batch and bucket alone, that jax's caches may not hold (conftest clears
  # them now and then).
  kw = dict(max_new_tokens=11, drafter=ngram(), tree=WIDE, min_bucket=32)
  specdec.generate(model, PROMPTS[:2], **{**kw, "max_new_tokens": 40})
  built = generate_lib.compile_ahead(model, PROMPTS[:2], **kw)
  assert built.count >= 2  # the prefill and the tree's decode chunk
  g = specdec.generate(model, PROMPTS[:2], **kw)
  assert g.stats["compiles"] <= 1 and len(g.tokens[0]) == 11  # at most one tiny eager op


def test_a_tree_step_shares_the_chain_prefill(model):
  """The prefill ignores the tree: every tree and k of a drafter share its executable."""
  sc = StepConfig(model.config, model.dtype, ngram(), 3, Sampling(), "greedy", ())
  tree_sc = StepConfig(model.config, model.dtype, ngram(), 2, Sampling(), "greedy", (),
                       tree=tree(WIDE))  # fmt: skip
  assert isinstance(tree_sc.tree, Tree) and sc.tree is None
  assert tree_sc.for_prefill == sc.for_prefill


# --- Lossless tree sampling: the step's statistical gate (tests/decoding/test_spec_gates.py) ---

small_vocab = gates.small_vocab  # the gate's 12-token target and draft model


def _tree_joint(model, drafter, s):
  """Counts of the first three sampled tokens of gates.PROMPT over gates.N_SAMPLES rows."""
  V = model.config.vocab_size
  counts = np.zeros((V, V, V))
  for seed in range(gates.N_SAMPLES // 10_000):
    out = specdec.generate(
      model, [gates.PROMPT] * 10_000, max_new_tokens=3, temperature=s.temperature,
      top_k=s.top_k, top_p=s.top_p, seed=seed, drafter=drafter, tree=WIDE, acceptance="onehot",
    )  # fmt: skip
    t = np.asarray(out.tokens)
    np.add.at(counts, (t[:, 0], t[:, 1], t[:, 2]), 1)
  return counts


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.6, 8, 0.9)])
def test_tree_sampling_is_lossless(small_vocab, temperature, top_k, top_p):
  """Depth 2 covers tokens 2 and 3 in one step, so both the walk's residuals (two children at the
  root) and the bonus after a full path are in the joint."""
  target, draft = small_vocab
  s = Sampling(temperature, top_k, top_p)
  counts = _tree_joint(target, draft_lm(draft), s)
  p = gates._exact_joint(target, s)
  pval, (tv, eps) = gates._gate(counts, p), gates._tv(counts, p)
  assert pval > 1e-4 and tv < eps, (pval, tv, eps)


def test_negative_control_keeping_a_rejected_childs_mass_fails(small_vocab, monkeypatch):
  """A walk that forgets the residual (p unchanged after a child is rejected) can still draw
  the rejected token and over-produces the draft's top tokens: the gate must catch it."""
  from specdec.decoding import accept as accept_lib  # noqa: PLC0415

  monkeypatch.setattr(accept_lib, "_residual", lambda p_BV, token_B: p_BV)
  target, draft = small_vocab
  s = Sampling(1.0, 0, 1.0)
  counts = _tree_joint(target, draft_lm(draft), s)
  assert gates._gate(counts, gates._exact_joint(target, s)) < 1e-4


@pytest.mark.parametrize("n, depth", [(2, 1), (3, 1), (4, 2), (7, 2), (8, 3), (64, 6)])
def test_binary_paths_make_an_n_node_tree(n, depth):
  t = tree(binary_paths(n))
  assert (t.size, t.depth) == (n, depth)
  assert max(max(p) for p in t.paths) <= 1  # at most two children a node
