"""Suffix decoding (arctic-inference's SuffixDecodingCache, chain mode), fixed shapes, on device.

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
shorter than k is padded with ngram's PAD. Not reproduced: trees (chain mode only), eviction
inside a request (the store is fixed for a generate call), and other rows' outputs of the same
batch (arctic's global tree holds every active request's response).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specdec.drafters.base import Drafter
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
) -> Suffix:
  """A suffix drafter; `history` (token-id sequences) are earlier requests' outputs."""
  return Suffix(
    max_depth=max_depth, max_spec_factor=max_spec_factor, max_spec_offset=max_spec_offset,
    min_token_prob=min_token_prob, store_size=store_size, store=pack_store(history, store_size),
  )  # fmt: skip


def speculate(drafter: Suffix, params, tokens_BS, lengths_B, prompt_lengths_B, k: int):
  """(draft_BJ, n_draft_B, score_B, match_B): the chosen chain padded to k, its length, score
  and match length, as arctic's `SuffixDecodingCache.speculate` with max_spec_tokens = k."""
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
  local = _best_chain(
    drafter, k, x_Bn[:, n_store:], buffer_seg_BS, ids_Bn[:, n_store:], x_Bn, ctx_Bt, ctx_len_B
  )
  seg_Bn = jnp.concatenate([seq_Bg, jnp.where(mine_BS, ACTIVE_SEQ, NO_SEQ)], 1)
  glob = _best_chain(drafter, k, x_Bn, seg_Bn, ids_Bn, x_Bn, ctx_Bt, ctx_len_B)
  pick_B = local[2] >= glob[2]
  return tuple(
    jnp.where(pick_B[:, None] if a.ndim == 2 else pick_B, a, b)
    for a, b in zip(local, glob, strict=True)
  )


def _first_occurrence(x_Bn):
  """For each position, the first position holding the same token: a token's count bin."""
  B, N = x_Bn.shape
  order_Bn = jnp.argsort(x_Bn, axis=1, stable=True)
  sorted_Bn = jnp.take_along_axis(x_Bn, order_Bn, 1)
  start_Bn = jnp.concatenate([jnp.ones((B, 1), bool), sorted_Bn[:, 1:] != sorted_Bn[:, :-1]], 1)
  run_Bn = jax.lax.cummax(jnp.where(start_Bn, jnp.arange(N), 0), axis=1)
  first_Bn = jnp.take_along_axis(order_Bn, run_Bn, 1)
  return jnp.zeros_like(x_Bn).at[jnp.arange(B)[:, None], order_Bn].set(first_Bn)


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
