"""Suffix decoding (arctic-inference's SuffixDecodingCache, chains and trees), on device.

Two token collections stand in for arctic's suffix trees: the row's own committed buffer (the
per-request tree over prompt + output) and the store, earlier requests' outputs, which with the
row's own output so far forms the global tree. A tree node's count is the number of occurrences
of its path, so instead of a tree each step finds, for every end position j, how many of the
context's last tokens end there (`_match_lengths`, capped by max_depth), and counts continuations
over those occurrences.

The rule reproduced from arctic's `SuffixTree::speculate`: for each match length m in
[1, min(L, max_depth) - 1] that occurs, a greedy chain from the occurrences of the context's
last m tokens: the next token is the most frequent continuation, its probability the running
product of count(path + token) / count(path) (an occurrence at the end of a sequence counts in
the denominator), drafted while it is >= min_token_prob, up to min(k, floor(m * max_spec_factor
+ max_spec_offset)) tokens and while the path stays within max_depth tokens. A chain scores the
sum of its probabilities; the best score wins, a tie going to the longer match, and the buffer's
draft beats the global one on a tie. Arithmetic is float32 as in arctic.

Ties between continuations of equal count: the one whose first occurrence after the path comes
first in [store; buffer] wins, the order in which arctic creates a node's children. Arctic takes
the head of its sibling list, whose order among equal counts also depends on the order in which
the counts grew; a fixed-shape count cannot replay that history. tests/drafters/test_suffix.py
checks on arctic's recorded run that every step where the two differ is a true tie. A chain
shorter than k is padded with ngram's PAD. Not reproduced: eviction inside a request (the store is
fixed for a generate call), and other rows' outputs of the same batch (arctic's global tree holds
every active request's response).

Trees (arctic's `use_tree_spec`, `SuffixTree::_speculate_tree`): arctic grows a draft tree best
first, by the probability of each node's path, up to max_spec_tokens nodes. Here the tree's shape
is static: node (r_1, .., r_d) is, for each match length, the child of rank r_d (by count, ties as
above) of node (r_1, .., r_{d-1}), its probability parent * count / parent count (arctic's float32
order), filled where >= min_token_prob and within max_depth. Of the filled nodes the most probable
min(max_tree_tokens or the tree's size, floor(m * max_spec_factor + max_spec_offset)) are kept,
ties to the earlier node, which keeps every kept node's ancestors and smaller siblings: on a tree
that holds arctic's whole draft this is arctic's best-first draft. The score is the kept nodes'
probabilities summed largest first, as arctic sums them, and picks m and the collection as for a
chain. Nodes not kept are NO_TOKEN (never accepted). One histogram per depth counts the children
of all that depth's nodes at every m: the end positions under one depth's nodes are disjoint
(each belongs to the node its next d tokens spell), so the (d+1)-gram after j, as a class id,
and j's match length are the bins.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec.drafters.base import NO_TOKEN, Drafter
from specdec.drafters.ngram import PAD

NO_SEQ = -1  # segment of an empty store slot or a stale buffer slot
ACTIVE_SEQ = 2**30  # segment of the row's own output inside the global collection


@dataclasses.dataclass(frozen=True)
class Suffix(Drafter):
  name = "suffix"
  max_depth: int = 24  # arctic's max_tree_depth: the longest path, match plus draft
  max_spec_factor: float = 1.0
  max_spec_offset: float = 0.0
  min_token_prob: float = 0.1
  store_size: int = 4096  # g: store slots for earlier requests' outputs
  # arctic's max_spec_tokens in tree mode: the most nodes of a static tree kept in one step; 0: all
  max_tree_tokens: int = 0
  # Earlier outputs, packed by `pack_store`; outside comparison so equal options share compiles.
  store: tuple = dataclasses.field(default=None, compare=False, repr=False)

  def __post_init__(self):
    if self.store_size < 1:
      raise ValueError(
        f"suffix store_size={self.store_size}: the store needs >= 1 slot (an empty store is "
        "store_size >= 1 with no history)"
      )
    if self.max_depth < 2:
      raise ValueError(f"suffix max_depth={self.max_depth}: a match and a draft need >= 2")
    if not 0.0 <= self.min_token_prob <= 1.0:
      raise ValueError(f"suffix min_token_prob={self.min_token_prob}: must be in [0, 1]")
    if self.max_spec_factor < 0:
      raise ValueError(f"suffix max_spec_factor={self.max_spec_factor}: must be >= 0")
    if self.max_tree_tokens < 0:
      raise ValueError(
        f"suffix max_tree_tokens={self.max_tree_tokens}: must be >= 0 (0: the whole tree)"
      )
    if self.store is None:
      object.__setattr__(self, "store", pack_store((), self.store_size))
    elif self.store[0].shape != (self.store_size,):
      raise ValueError(
        f"suffix store holds {self.store[0].shape[0]} slots, store_size is {self.store_size}"
      )

  @property
  def params(self):
    tokens_g, seq_g = self.store
    return {"tokens_g": jnp.asarray(tokens_g), "seq_g": jnp.asarray(seq_g)}

  def validate(self, target_config, k, slots):
    if self.max_depth > slots:
      raise ValueError(
        f"suffix max_depth={self.max_depth} exceeds the token buffer's {slots} slots"
      )
    top = int(self.store[0].max(initial=-1))
    if top >= target_config.vocab_size:
      raise ValueError(
        f"suffix store holds token {top}, outside the target's vocabulary "
        f"({target_config.vocab_size})"
      )

  def init(self, params, prompt_BT, lengths_B, target):
    return lengths_B  # the prompt lengths: where each row's own output starts

  def propose(self, params, state, ctx, k, sampling, key):
    draft_BJ, _, _, _ = speculate(self, params, ctx.tokens_BS, ctx.lengths_B, state, k)
    return draft_BJ, None, state

  def validate_tree(self, tree):
    pass  # any tree: a node the counts cannot fill is NO_TOKEN

  def propose_tree(self, params, state, ctx, tree, sampling, key):
    draft_BJ, _, _, _ = speculate_tree(self, params, ctx.tokens_BS, ctx.lengths_B, state, tree)
    return draft_BJ, state

  def commit_tree(self, params, state, ctx, accepted, target):
    return state


def pack_store(history, store_size: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens_g, seq_g): earlier outputs laid end to end, each its own sequence id, the oldest
  dropped whole when they do not all fit (arctic evicts the oldest too)."""
  kept, used = [], 0
  for seq in reversed([np.asarray(s, np.int32).reshape(-1) for s in history]):
    if used + len(seq) > store_size:
      if not kept:
        raise ValueError(
          f"suffix history: the newest output has {len(seq)} tokens, store_size={store_size}"
        )
      break
    kept.insert(0, seq)
    used += len(seq)
  tokens_g = np.full((store_size,), -1, np.int32)
  seq_g = np.full((store_size,), NO_SEQ, np.int32)
  at = 0
  for i, seq in enumerate(kept):
    if seq.size and seq.min() < 0:
      raise ValueError(f"suffix history: output {i} holds a negative token id")
    tokens_g[at : at + len(seq)], seq_g[at : at + len(seq)] = seq, i
    at += len(seq)
  return tokens_g, seq_g


def suffix(
  max_depth: int = 24,
  max_spec_factor: float = 1.0,
  max_spec_offset: float = 0.0,
  min_token_prob: float = 0.1,
  store_size: int = 4096,
  history=(),
  max_tree_tokens: int = 0,
) -> Suffix:
  """A suffix drafter; `history` (token-id sequences) are earlier requests' outputs."""
  return Suffix(
    max_depth=max_depth, max_spec_factor=max_spec_factor, max_spec_offset=max_spec_offset,
    min_token_prob=min_token_prob, store_size=store_size, max_tree_tokens=max_tree_tokens,
    store=pack_store(history, store_size),
  )  # fmt: skip


def speculate(drafter: Suffix, params, tokens_BS, lengths_B, prompt_lengths_B, k: int):
  """(draft_BJ, n_draft_B, score_B, match_B): the chosen chain padded to k, its length, score
  and match length, as arctic's `SuffixDecodingCache.speculate` with max_spec_tokens = k."""
  local, glob = _collections(drafter, params, tokens_BS, lengths_B, prompt_lengths_B)
  return _pick(
    _best_chain(drafter, k, *local[:3], glob[0], *local[3:]),
    _best_chain(drafter, k, *glob[:3], glob[0], *glob[3:]),
  )


def speculate_tree(drafter: Suffix, params, tokens_BS, lengths_B, prompt_lengths_B, tree):
  """(draft_BJ, prob_BJ, score_B, match_B): a token per drafted node of the static `tree`
  (NO_TOKEN where none is kept), each kept node's probability (0 elsewhere), the score and the
  match length, as arctic's tree-mode `speculate` restricted to the tree's shape."""
  local, glob = _collections(drafter, params, tokens_BS, lengths_B, prompt_lengths_B)
  return _pick(_best_tree(drafter, tree, *local), _best_tree(drafter, tree, *glob))


def _collections(drafter: Suffix, params, tokens_BS, lengths_B, prompt_lengths_B):
  """(x_Bn, seg_Bn, ids_Bn, ctx_Bt, ctx_len_B) of the per-request collection (the committed
  buffer) and of the global one ([store; the row's own output]); ids are count bins shared by
  both, positions in [store; buffer] where each token first appears."""
  B, S = tokens_BS.shape
  depth = drafter.max_depth
  store_Bg = jnp.broadcast_to(params["tokens_g"], (B, params["tokens_g"].shape[0]))
  seq_Bg = jnp.broadcast_to(params["seq_g"], store_Bg.shape)
  s_S = jnp.arange(S)
  committed_BS = s_S[None] < lengths_B[:, None]
  mine_BS = committed_BS & (s_S[None] >= prompt_lengths_B[:, None])
  x_Bn = jnp.concatenate([store_Bg, tokens_BS], 1)
  ids_Bn = _first_occurrence(x_Bn)
  ctx_Bt = jnp.take_along_axis(
    tokens_BS, jnp.clip(lengths_B[:, None] - depth + jnp.arange(depth), 0), 1
  )
  ctx_len_B = jnp.minimum(lengths_B, depth)
  n_store = store_Bg.shape[1]
  buffer_seg_BS = jnp.where(committed_BS, 0, NO_SEQ)
  seg_Bn = jnp.concatenate([seq_Bg, jnp.where(mine_BS, ACTIVE_SEQ, NO_SEQ)], 1)
  local = (x_Bn[:, n_store:], buffer_seg_BS, ids_Bn[:, n_store:], ctx_Bt, ctx_len_B)
  return local, (x_Bn, seg_Bn, ids_Bn, ctx_Bt, ctx_len_B)


def _pick(local, glob):
  """The per-request collection's result where its score is >= the global one's (arctic's rule)."""
  pick_B = local[2] >= glob[2]
  return tuple(
    jnp.where(pick_B.reshape(pick_B.shape + (1,) * (a.ndim - 1)), a, b)
    for a, b in zip(local, glob, strict=True)
  )


def _first_occurrence(*keys_Bn):
  """For each position, the first position holding the same keys (one token: its count bin)."""
  B, N = keys_Bn[0].shape
  iota_Bn = jnp.broadcast_to(jnp.arange(N, dtype=jnp.int32), (B, N))
  *sorted_Bn, order_Bn = jax.lax.sort((*keys_Bn, iota_Bn), 1, True, len(keys_Bn))
  new_Bn = functools.reduce(jnp.logical_or, [a[:, 1:] != a[:, :-1] for a in sorted_Bn])
  start_Bn = jnp.concatenate([jnp.ones((B, 1), bool), new_Bn], 1)
  run_Bn = jax.lax.cummax(jnp.where(start_Bn, jnp.arange(N), 0), axis=1)
  first_Bn = jnp.take_along_axis(order_Bn, run_Bn, 1)
  return jnp.zeros_like(iota_Bn).at[jnp.arange(B)[:, None], order_Bn].set(first_Bn)


def _shift(a_Bn, n: int, fill: int):
  """a[j - n] at j (n > 0 looks back, n < 0 ahead), `fill` where that falls off the array."""
  N = a_Bn.shape[1]
  if n >= 0:
    return jnp.pad(a_Bn[:, : N - n], ((0, 0), (n, 0)), constant_values=fill)
  return jnp.pad(a_Bn[:, -n:], ((0, 0), (0, -n)), constant_values=fill)


def _match_lengths(x_Bn, seg_Bn, ctx_Bt, ctx_len_B):
  """How many of the context's last tokens end at each position, within one sequence."""
  depth = ctx_Bt.shape[1]
  run_Bn = seg_Bn >= 0
  ell_Bn = jnp.zeros(x_Bn.shape, jnp.int32)
  for i in range(depth):
    same_Bn = (_shift(x_Bn, i, -1) == ctx_Bt[:, depth - 1 - i, None]) & (
      _shift(seg_Bn, i, NO_SEQ) == seg_Bn
    )
    run_Bn &= same_Bn & (i < ctx_len_B)[:, None]
    ell_Bn += run_Bn
  return ell_Bn


def _max_tokens(drafter: Suffix, m: int, k: int) -> int:
  """arctic's draft cap for match length m: float32 m * factor + offset, then + 1e-6, truncated."""
  f32 = np.float32(m) * np.float32(drafter.max_spec_factor) + np.float32(drafter.max_spec_offset)
  return max(min(k, int(float(f32) + 1e-6)), 0)


def _best_chain(drafter: Suffix, k, x_Bn, seg_Bn, ids_Bn, all_Bn, ctx_Bt, ctx_len_B):
  """The best-scoring greedy chain over match lengths m = 1..max_depth-1 in one collection x_Bn;
  ids_Bn are count bins, positions in [store; buffer] (all_Bn) where each token first appears
  (n_all of them, one more bin for occurrences with no continuation)."""
  B, N = x_Bn.shape
  n_all = all_Bn.shape[1]
  depth = drafter.max_depth
  lens_m = np.arange(1, depth)
  ell_Bn = _match_lengths(x_Bn, seg_Bn, ctx_Bt, ctx_len_B)
  occ_Bmn = ell_Bn[:, None, :] >= lens_m[None, :, None]
  n_Bm = occ_Bmn.sum(-1)
  matched_Bm = (n_Bm > 0) & (lens_m[None] < ctx_len_B[:, None])
  cap_m = np.array([min(_max_tokens(drafter, int(m), k), depth - m) for m in lens_m])
  prob_Bm = jnp.ones(n_Bm.shape, jnp.float32)
  score_Bm = jnp.zeros(n_Bm.shape, jnp.float32)
  alive_Bm = jnp.ones(n_Bm.shape, bool)
  len_Bm = jnp.zeros(n_Bm.shape, jnp.int32)
  draft = []
  b_B11, m_1m1 = jnp.arange(B)[:, None, None], jnp.arange(depth - 1)[None, :, None]
  for d in range(k):
    cont_Bn = _shift(seg_Bn, -(d + 1), NO_SEQ) == seg_Bn
    bin_Bn = jnp.where(cont_Bn, _shift(ids_Bn, -(d + 1), n_all), n_all)
    hist_Bmn = jnp.zeros((B, depth - 1, n_all + 1), jnp.int32)
    hist_Bmn = hist_Bmn.at[b_B11, m_1m1, bin_Bn[:, None, :]].add(occ_Bmn.astype(jnp.int32))
    count_Bm = jnp.max(hist_Bmn[..., :n_all], -1)
    # Of the most frequent continuations, the one seen first (arctic creates children in order).
    bin_Bmn = jnp.broadcast_to(bin_Bn[:, None, :], occ_Bmn.shape)
    top_Bmn = occ_Bmn & (bin_Bmn < n_all)
    top_Bmn &= jnp.take_along_axis(hist_Bmn, bin_Bmn, 2) == count_Bm[..., None]
    best_Bm = jnp.take_along_axis(bin_Bn, jnp.argmax(top_Bmn, -1), 1)
    tok_Bm = jnp.take_along_axis(all_Bn, best_Bm, 1)
    p_Bm = prob_Bm * (count_Bm.astype(jnp.float32) / n_Bm.astype(jnp.float32))
    alive_Bm &= (d < cap_m)[None] & (count_Bm > 0) & (p_Bm >= np.float32(drafter.min_token_prob))
    score_Bm += jnp.where(alive_Bm, p_Bm, 0.0)
    len_Bm += alive_Bm
    draft.append(jnp.where(alive_Bm, tok_Bm, PAD))
    prob_Bm = jnp.where(alive_Bm, p_Bm, prob_Bm)
    occ_Bmn &= bin_Bn[:, None, :] == best_Bm[..., None]
    n_Bm = count_Bm
  # The best score among the matched lengths, a tie to the longest (arctic's `>=` over rising m).
  top_B = jnp.max(jnp.where(matched_Bm, score_Bm, -1.0), 1)
  win_Bm = matched_Bm & (score_Bm == top_B[:, None])
  m_B = jnp.max(jnp.where(win_Bm, lens_m[None], 0), 1)
  at_B1 = jnp.maximum(m_B - 1, 0)[:, None]
  found_B = m_B > 0
  draft_BJ = jnp.take_along_axis(jnp.stack(draft, -1), at_B1[..., None], 1)[:, 0]
  n_B = jnp.where(found_B, jnp.take_along_axis(len_Bm, at_B1, 1)[:, 0], 0)
  score_B = jnp.where(found_B, top_B, 0.0)
  return jnp.where(found_B[:, None], draft_BJ, PAD).astype(jnp.int32), n_B, score_B, m_B


def _gram_ids(seg_Bn, ids_Bn, n: int):
  """[G_1 .. G_n], each [B, N]: G_d at end position j is the first position whose next d tokens
  equal j's next d (all in j's sequence), N where they run past it: one id per node path."""
  B, N = seg_Bn.shape
  g_Bn = jnp.zeros((B, N), jnp.int32)  # the empty path
  out = []
  for d in range(1, n + 1):
    ok_Bn = (g_Bn < N) & (seg_Bn >= 0) & (_shift(seg_Bn, -d, NO_SEQ) == seg_Bn)
    first_Bn = _first_occurrence(
      jnp.where(ok_Bn, g_Bn, N), jnp.where(ok_Bn, _shift(ids_Bn, -d, 0), 0)
    )
    g_Bn = jnp.where(ok_Bn, first_Bn, N)
    out.append(g_Bn)
  return out


def _at(a_Bn, at_Bmq):
  """a[b, at[b, m, q]]."""
  return jnp.take_along_axis(a_Bn, at_Bmq.reshape(at_Bmq.shape[0], -1), 1).reshape(at_Bmq.shape)


def _top_per_parent(cnt_Bmn, slot_Bmn, q: int):
  """(count, end position) of each of q parents' most frequent child, the earliest end position
  among equals ([B, M, q]; count 0 where none): one scatter of count * N + (N - 1 - j) where
  that fits int32, else a max then a min."""
  B, M, N = cnt_Bmn.shape
  b_B11, m_1m1 = jnp.arange(B)[:, None, None], jnp.arange(M)[None, :, None]
  j_n = jnp.arange(N, dtype=jnp.int32)
  if (N + 1) * N < 2**31:
    both_Bmn = jnp.where(cnt_Bmn > 0, cnt_Bmn * N + (N - 1 - j_n), -1)
    both_Bmq = jnp.full((B, M, q + 1), -1, jnp.int32).at[b_B11, m_1m1, slot_Bmn].max(both_Bmn)
    both_Bmq = both_Bmq[..., :q]
    found_Bmq = both_Bmq >= 0
    top_Bmq = jnp.where(found_Bmq, both_Bmq // N, 0)
    return top_Bmq, jnp.where(found_Bmq, N - 1 - both_Bmq % N, N - 1)
  top_Bmq = jnp.zeros((B, M, q + 1), jnp.int32).at[b_B11, m_1m1, slot_Bmn].max(cnt_Bmn)
  at_Bmn = jnp.minimum(slot_Bmn, q)
  is_top_Bmn = (cnt_Bmn > 0) & (cnt_Bmn == jnp.take_along_axis(top_Bmq, at_Bmn, 2))
  first_Bmq = jnp.full((B, M, q + 1), N - 1, jnp.int32)
  first_Bmq = first_Bmq.at[b_B11, m_1m1, jnp.where(is_top_Bmn, slot_Bmn, q)].min(j_n)
  return top_Bmq[..., :q], first_Bmq[..., :q]


def _best_tree(drafter: Suffix, tree, x_Bn, seg_Bn, ids_Bn, ctx_Bt, ctx_len_B):
  """The best-scoring fill of the static `tree` over match lengths m = 1..max_depth-1 in one
  collection: (draft_BJ, prob_BJ, score_B, match_B) as `speculate_tree` returns them."""
  B, N = x_Bn.shape
  depth, n = drafter.max_depth, tree.size
  lens_m = np.arange(1, depth)
  M = len(lens_m)
  ell_Bn = _match_lengths(x_Bn, seg_Bn, ctx_Bt, ctx_len_B)
  occ_Bmn = ell_Bn[:, None, :] >= lens_m[None, :, None]
  n_Bm = occ_Bmn.sum(-1, dtype=jnp.int32)
  matched_Bm = (n_Bm > 0) & (lens_m[None] < ctx_len_B[:, None])
  grams = _gram_ids(seg_Bn, ids_Bn, tree.depth)
  b_B1 = jnp.arange(B)[:, None]
  tok, count = [None] * n, [None] * n
  count[0] = n_Bm
  # Each end position's node at the current depth, as an index into that depth's parents q.
  parents = [0]
  under_Bmn = jnp.where(occ_Bmn, 0, -1)
  for d in range(tree.depth):
    q = len(parents)
    nxt = [int(c) for p in parents for c in tree.children[p] if c >= 0 and tree.children[c, 0] >= 0]
    key_Bn = grams[d]
    inside_Bmn = (under_Bmn >= 0) & (key_Bn < N)[:, None]
    key_Bmn = jnp.where(inside_Bmn, key_Bn[:, None], N)
    # A path's count at m: its end positions matching >= m context tokens (a path fixes its
    # parent, so this is the count under the parent wherever the parent is a node at m).
    bin_Bn = jnp.where(ell_Bn > 0, jnp.minimum(ell_Bn, M) - 1, M)  # M (no match): dropped
    hist_Bnm = jnp.zeros((B, N + 1, M), jnp.int32).at[b_B1, key_Bn, bin_Bn].add(1, mode="drop")
    at_least_Bnm = jnp.cumsum(hist_Bnm[..., ::-1], -1)[..., ::-1]
    at_least_Bmn = jnp.moveaxis(at_least_Bnm, 2, 1)
    cnt_Bmn = jnp.where(inside_Bmn, jnp.take_along_axis(at_least_Bmn, key_Bmn, 2), 0)
    slot_Bmn = jnp.where(inside_Bmn, under_Bmn, q)  # q: dropped
    at_Bmn = jnp.maximum(under_Bmn, 0)
    next_Bmn = jnp.full((B, M, N), -1, jnp.int32)
    for r in range(int((tree.children[parents] >= 0).sum(1).max())):
      # The most frequent path not yet taken under each parent, the earliest end position on a tie.
      top_Bmq, first_Bmq = _top_per_parent(cnt_Bmn, slot_Bmn, q)
      tok_Bmq = _at(x_Bn, jnp.minimum(first_Bmq + d + 1, N - 1))
      best_Bmq = jnp.where(top_Bmq > 0, _at(key_Bn, first_Bmq), -1)
      taken_Bmn = inside_Bmn & (key_Bmn == jnp.take_along_axis(best_Bmq, at_Bmn, 2))
      cnt_Bmn = jnp.where(taken_Bmn, 0, cnt_Bmn)
      child_q = tree.children[parents, r]
      into_q = np.asarray([nxt.index(c) if c in nxt else -1 for c in child_q], np.int32)
      next_Bmn = jnp.where(taken_Bmn, jnp.asarray(into_q)[at_Bmn], next_Bmn)
      for i, c in enumerate(child_q):
        if c >= 0:
          tok[c], count[c] = tok_Bmq[..., i], top_Bmq[..., i]
    parents, under_Bmn = nxt, next_Bmn
  # Probabilities down the tree in arctic's float32 order: parent * count, then / parent count,
  # where a node branches; a child with all its parent's count shares the parent's tree node.
  count_BmT = jnp.stack(count, -1)
  prob_BmT = jnp.ones((B, M, n), jnp.float32)
  fill_BmT = jnp.ones((B, M, n), bool)
  room_m = depth - lens_m  # a path within max_depth: match plus draft
  for d in range(1, tree.depth + 1):
    c_q = tree.at_depth(d)
    p_q = tree.parents[c_q]
    own_Bmq, up_Bmq, p_up_Bmq = count_BmT[..., c_q], count_BmT[..., p_q], prob_BmT[..., p_q]
    ratio_Bmq = p_up_Bmq * own_Bmq.astype(jnp.float32) / jnp.maximum(up_Bmq, 1).astype(jnp.float32)
    p_Bmq = jnp.where(own_Bmq == up_Bmq, p_up_Bmq, ratio_Bmq)
    ok_Bmq = fill_BmT[..., p_q] & (own_Bmq > 0) & (d <= room_m)[None, :, None]
    ok_Bmq &= p_Bmq >= np.float32(drafter.min_token_prob)
    prob_BmT, fill_BmT = prob_BmT.at[..., c_q].set(p_Bmq), fill_BmT.at[..., c_q].set(ok_Bmq)
  p_BmJ, fill_BmJ = prob_BmT[..., 1:], fill_BmT[..., 1:]
  tok_BmJ = jnp.stack(tok[1:], -1)
  # Keep the most probable nodes up to the budget, ties to the earlier node (best first).
  budget = drafter.max_tree_tokens or n - 1
  cap_m = np.array([_max_tokens(drafter, int(m), budget) for m in lens_m])
  v_BmJ = jnp.where(fill_BmJ, p_BmJ, -1.0)
  J = n - 1
  earlier_JJ = np.arange(J)[None, :] < np.arange(J)[:, None]
  ahead_BmJJ = (v_BmJ[..., None, :] > v_BmJ[..., :, None]) | (
    (v_BmJ[..., None, :] == v_BmJ[..., :, None]) & earlier_JJ
  )
  rank_BmJ = jnp.sum(ahead_BmJJ & fill_BmJ[..., None, :], -1)
  keep_BmJ = fill_BmJ & (rank_BmJ < cap_m[None, :, None])
  # arctic adds each node's probability as it pops them, the largest first.
  desc_BmJ = -jnp.sort(-jnp.where(keep_BmJ, p_BmJ, 0.0), -1)
  score_Bm = jax.lax.fori_loop(
    0, J, lambda j, acc_Bm: acc_Bm + desc_BmJ[..., j], jnp.zeros((B, M), jnp.float32)
  )
  top_B = jnp.max(jnp.where(matched_Bm, score_Bm, -1.0), 1)
  win_Bm = matched_Bm & (score_Bm == top_B[:, None])
  m_B = jnp.max(jnp.where(win_Bm, lens_m[None], 0), 1)
  at_B11 = jnp.maximum(m_B - 1, 0)[:, None, None]
  found_B = m_B > 0
  keep_BJ = found_B[:, None] & jnp.take_along_axis(keep_BmJ, at_B11, 1)[:, 0]
  draft_BJ = jnp.where(keep_BJ, jnp.take_along_axis(tok_BmJ, at_B11, 1)[:, 0], NO_TOKEN)
  prob_BJ = jnp.where(keep_BJ, jnp.take_along_axis(p_BmJ, at_B11, 1)[:, 0], 0.0)
  score_B = jnp.where(found_B, top_B, 0.0)
  return draft_BJ.astype(jnp.int32), prob_BJ, score_B, m_B
