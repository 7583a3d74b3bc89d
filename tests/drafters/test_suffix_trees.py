"""Suffix decoding's static trees: arctic-inference's own tree-mode drafts on a recorded stream
(tests/fixtures/suffix/tree.json), the rule on random contexts against a direct count, and greedy
identity through generate(tree=)."""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.decoding.tree import tree
from specdec.drafters import suffix
from specdec.drafters.base import NO_TOKEN
from specdec.drafters.suffix import speculate_tree
from tests.helpers import tiny_model

REF = json.load(open("tests/fixtures/suffix/stream.json"))
TREE_REF = json.load(open("tests/fixtures/suffix/tree.json"))
WIDE = [(0,), (1,), (0, 0), (0, 1), (1, 0)]
BUSHY = [(0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0), (0, 0, 1)]


def universal_paths(budget: int) -> list[tuple[int, ...]]:
  """Every node a best-first tree of `budget` nodes can reach: paths whose node with its
  ancestors and their smaller siblings number <= budget (sum of rank + 1 along the path)."""
  out = []

  def grow(path, used):
    for r in itertools.count():
      if used + r + 1 > budget:
        return
      out.append(path + (r,))
      grow(path + (r,), used + r + 1)

  grow((), 0)
  return out


def _node_paths(t, draft_J, prob_J) -> dict:
  """{token path from the root: probability} of the kept nodes."""
  return {
    tuple(int(draft_J[c - 1]) for c in t.path_to[i, 1 : t.depths[i] + 1]): float(prob_J[i - 1])
    for i in range(1, t.size)
    if draft_J[i - 1] != NO_TOKEN
  }


def _arctic_paths(d) -> dict:
  out = {}
  for i in range(len(d["token_ids"])):
    path, j = [], i
    while j >= 0:
      path.append(d["token_ids"][j])
      j = d["parents"][j]
    out[tuple(reversed(path))] = d["probs"][i]
  return out


@pytest.mark.slow
@pytest.mark.optimized
def test_tree_drafts_match_arctic_tree_mode_on_the_recorded_stream():
  # Every context arctic's tree-mode run drafted from (the simulator's steps, then the prompt
  # prefixes), on the tree holding every best-first tree of max_spec_tokens nodes: the same
  # match length and float32 score everywhere, and the same nodes with the same probabilities,
  # except where arctic's heap took one of several equally probable nodes (its order among
  # equals is the heap's); there only nodes of equal probability differ.
  st = TREE_REF["settings"]
  budget = st["max_spec_tokens"]
  t = tree(universal_paths(budget))
  dr = suffix(
    max_depth=st["max_depth"], max_spec_factor=st["max_spec_factor"],
    min_token_prob=st["min_token_prob"], history=[REF["cached"]["response"]],
    store_size=len(REF["cached"]["response"]), max_tree_tokens=budget,
  )  # fmt: skip
  prompt, resp = REF["request"]["prompt"], REF["request"]["response"]
  steps, probes = TREE_REF["steps"], TREE_REF["probes"]
  done = np.cumsum([0] + [s["num_accept_toks"] + 1 for s in steps])[: len(steps)]
  # (buffer, committed length, prompt length) of each context.
  stream_S = np.asarray(prompt + resp, np.int32)
  contexts = [(stream_S, len(prompt) + int(n), len(prompt)) for n in done]
  contexts += [(stream_S[: len(prompt)], p["prefix"], p["prefix"]) for p in probes]
  refs = steps + probes
  S, rows = len(stream_S), 32  # the store and the buffer hold the recordings exactly
  f = jax.jit(lambda p, tok, n, pl: speculate_tree(dr, p, tok, n, pl, t))
  got = []
  for lo in range(0, len(contexts), rows):
    batch = contexts[lo : lo + rows]
    batch += [batch[-1]] * (rows - len(batch))
    tokens_BS = np.zeros((rows, S), np.int32)
    for b, (buf, _, _) in enumerate(batch):
      tokens_BS[b, : len(buf)] = buf
    lengths_B, prompt_B = (jnp.asarray([c[i] for c in batch]) for i in (1, 2))
    out = f(dr.params, jnp.asarray(tokens_BS), lengths_B, prompt_B)
    got += list(zip(*[np.asarray(a) for a in out], strict=True))[: len(contexts) - lo]
  ties = []
  for i, ((draft_J, prob_J, score, m), ref) in enumerate(zip(got, refs, strict=True)):
    assert (m, np.float32(score)) == (ref["match_len"], np.float32(ref["score"])), i
    ours, theirs = _node_paths(t, draft_J, prob_J), _arctic_paths(ref)
    assert len(ours) == len(theirs), i
    for path in ours.keys() & theirs.keys():
      assert np.float32(ours[path]) == np.float32(theirs[path]), (i, path)
    if ours.keys() != theirs.keys():
      ties.append(i)
      only = [sorted(np.float32(d[p]) for p in d.keys() - other.keys()) for d, other in
              ((ours, theirs), (theirs, ours))]  # fmt: skip
      assert only[0] == only[1], (i, ours, theirs)
    if i < len(steps):  # the simulator's verification of the same tree against the response
      n_i = int(done[i])
      acc = _accepted(ours, resp[n_i:])
      assert acc == ref["num_accept_toks"] or i in ties, i
  assert sum(len(set(r["parents"])) < len(r["parents"]) for r in refs) >= 20  # trees branch
  assert len(ties) <= 8, ties  # of 393 contexts


def _accepted(paths: dict, truth) -> int:
  n = 0
  while n < len(truth) and tuple(truth[: n + 1]) in paths:
    n += 1
  return n


# --- The rule on random contexts, against a direct count (the module docstring's rule) ---


def _count_tree(dr, t, budget, seqs, ctx):
  """The fill of tree t from one collection (a list of sequences, in collection order) by
  counting occurrences directly: (tokens per drafted node or NO_TOKEN, probs, score, m)."""
  best = (np.float32(-1.0), 0, [NO_TOKEN] * (t.size - 1), [0.0] * (t.size - 1))
  L = min(len(ctx), dr.max_depth)
  for m in range(1, L):
    pat = ctx[len(ctx) - m :]
    ends = [(s, i) for s, seq in enumerate(seqs) for i in range(m - 1, len(seq))
            if list(seq[i - m + 1 : i + 1]) == pat]  # fmt: skip
    if not ends:
      break
    under, tok, cnt = {0: ends}, {}, {0: len(ends)}
    for c in range(1, t.size):
      p, d = int(t.parents[c]), int(t.depths[c])
      rank = t.paths[c - 1][-1]
      kids = {}
      for s, i in under.get(p, []):
        if i + d < len(seqs[s]):
          kids.setdefault(seqs[s][i + d], []).append((s, i))
      order = sorted(kids, key=lambda x: (-len(kids[x]), kids[x][0]))
      if rank < len(order):
        tok[c], under[c], cnt[c] = order[rank], kids[order[rank]], len(kids[order[rank]])
    prob, kept = {0: np.float32(1.0)}, {0}
    for c in range(1, t.size):
      p = int(t.parents[c])
      if c not in tok or p not in kept:
        continue
      ratio = np.float32(np.float32(prob[p] * np.float32(cnt[c])) / np.float32(cnt[p]))
      prob[c] = prob[p] if cnt[c] == cnt[p] else ratio
      if prob[c] >= np.float32(dr.min_token_prob) and t.depths[c] <= dr.max_depth - m:
        kept.add(c)
    spec = np.float32(m) * np.float32(dr.max_spec_factor) + np.float32(dr.max_spec_offset)
    cap = min(budget, int(float(spec) + 1e-6))
    chosen = sorted(kept - {0}, key=lambda c: (-prob[c], c))[:cap]
    score = np.float32(0.0)
    for c in sorted(chosen, key=lambda c: -prob[c]):
      score = np.float32(score + prob[c])
    if score >= best[0]:
      draft = [tok[c] if c in chosen else NO_TOKEN for c in range(1, t.size)]
      probs = [float(prob[c]) if c in chosen else 0.0 for c in range(1, t.size)]
      best = (score, m, draft, probs)
  return best


@pytest.mark.parametrize("paths", [WIDE, BUSHY, universal_paths(4)], ids=["wide", "bushy", "u4"])
def test_tree_fill_is_the_direct_count_on_random_contexts(paths):
  t = tree(paths)
  rng = np.random.default_rng(len(paths))
  history = [rng.integers(0, 3, n).tolist() for n in (7, 5)]
  dr = suffix(
    max_depth=6, max_spec_factor=2.0, max_spec_offset=1.0, min_token_prob=0.15, store_size=16,
    history=history, max_tree_tokens=5,
  )  # fmt: skip
  S, B = 24, 16
  tokens_BS = rng.integers(0, 3, (B, S)).astype(np.int32)
  prompt_B = rng.integers(1, 10, B)
  lengths_B = np.minimum(prompt_B + rng.integers(0, 14, B), S)
  out = jax.jit(lambda p, *a: speculate_tree(dr, p, *a, t))(
    dr.params, jnp.asarray(tokens_BS), jnp.asarray(lengths_B), jnp.asarray(prompt_B)
  )
  wins = [0, 0]  # rows whose draft came from the global collection, from the request's own
  for b in range(B):
    buf = tokens_BS[b, : lengths_B[b]].tolist()
    ctx = buf
    local = _count_tree(dr, t, 5, [buf], ctx)
    glob = _count_tree(dr, t, 5, [*history, buf[prompt_B[b] :]], ctx)
    wins[bool(local[0] >= glob[0])] += 1
    score, m, draft, probs = local if local[0] >= glob[0] else glob
    if score < 0:  # no match anywhere
      score, m = 0.0, 0
    got_draft, got_prob, got_score, got_m = (np.asarray(a[b]) for a in out)
    assert got_draft.tolist() == draft and int(got_m) == m, b
    np.testing.assert_array_equal(got_prob, np.asarray(probs, np.float32))
    assert np.float32(got_score) == np.float32(score), b
  assert min(wins) > 0  # both collections drafted some rows


@pytest.mark.parametrize(
  "kw, draft, score",
  [
    (dict(), [1, 2, 3, 4, NO_TOKEN, 5], 1.25),
    (dict(max_tree_tokens=3), [1, 2, NO_TOKEN, NO_TOKEN, NO_TOKEN, 5], 1.0),
    (dict(min_token_prob=0.2), [1, 2, NO_TOKEN, NO_TOKEN, NO_TOKEN, 5], 1.0),
    (dict(max_depth=2), [1, 2, 3, 4, NO_TOKEN, NO_TOKEN], 0.875),
  ],
  ids=["all", "budget", "min_prob", "depth"],
)
def test_children_rank_by_count_then_first_seen(kw, draft, score):
  # After "5" (8 occurrences, the last at the end): 1 three times, 2 twice, 3 and 4 once each (3
  # seen first), so the root's children are 1, 2, 3, 4 and no fifth; "5 1" is always followed by
  # 5, which keeps 1's probability 3/8. The match "1 5" (then only 2, p = 2/3) scores less.
  # A budget keeps the most probable nodes (1, then its child 5 at the same 3/8, then 2);
  # min_token_prob drops 3 and 4; max_depth = 2 leaves no room below a match of 1.
  ctx = [5, 1, 5, 2, 5, 3, 5, 1, 5, 2, 5, 4, 5, 1, 5]
  t = tree([(0,), (1,), (2,), (3,), (4,), (0, 0)])
  dr = suffix(**{"max_depth": 3, "min_token_prob": 0.0, "max_spec_factor": 8.0, **kw})
  tokens = jnp.zeros((1, 32), jnp.int32).at[0, : len(ctx)].set(jnp.asarray(ctx))
  n = jnp.asarray([len(ctx)])
  got, prob, got_score, m = speculate_tree(dr, dr.params, tokens, n, n, t)
  assert np.asarray(got[0]).tolist() == draft and int(m[0]) == 1
  assert float(got_score[0]) == pytest.approx(score)
  assert [p > 0 for p in np.asarray(prob[0])] == [x != NO_TOKEN for x in draft]


@pytest.fixture(scope="module")
def target():
  model = tiny_model()
  return specdec.Model(model.config.replace(eos_token_ids=()), model.params, None, model.dtype)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("paths", [WIDE, BUSHY], ids=["wide", "bushy"])
def test_generate_with_a_suffix_tree_gives_the_baseline_greedy_tokens(target, paths, batch):
  prompts = [[3, 5, 7, 3, 5, 7, 3, 5], [1, 2, 3, 4, 1, 2]][:batch]
  base = specdec.generate(target, prompts, max_new_tokens=24)
  empty = suffix(store_size=64)
  got = specdec.generate(target, prompts, max_new_tokens=24, drafter=empty, tree=paths)
  assert got.tokens == base.tokens
  # Earlier outputs in the store: the same tokens, most of every path accepted.
  again = suffix(store_size=64, history=list(base.tokens))
  got = specdec.generate(target, prompts, max_new_tokens=24, drafter=again, tree=paths)
  assert got.tokens == base.tokens
  t = tree(paths)
  assert (got.stats["k"], got.stats["verify_width"]) == (t.depth, t.size)
  assert got.stats["tau"] > t.depth  # tokens per step: most steps accept a full path
