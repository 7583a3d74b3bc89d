"""Prompt lookup: propose the tokens that followed the most recent earlier occurrence of the
longest suffix (n in [min_n, max_n]) of the committed context. Fixed-shape search over the whole
token buffer on the device; proposals that would run past the committed context are padded.

Trees: a node's children of ranks 0, 1, .. are the distinct tokens that followed earlier
occurrences of the node's own suffix (the committed context, then the path down to the node),
ranked longest match first, then most recent; one search per depth covers its nodes at once.
A node no continuation fills is NO_TOKEN, and so are its descendants (never accepted).
Shapes: B rows, S slots, J drafts (a tree's drafted nodes), n tree nodes, m the nodes one depth
searches for.
"""

import dataclasses

import jax.numpy as jnp

from specdec.drafters.base import NO_TOKEN, Drafter

PAD = 0  # a padded proposal is just an unlikely guess: acceptance stays lossless


# Compares by value, so equal drafters share compiled steps across generate calls.
@dataclasses.dataclass(frozen=True)
class NGram(Drafter):
  name = "ngram"
  min_n: int = 1
  max_n: int = 4

  def validate(self, target_config, k, slots):
    if not 1 <= self.min_n <= self.max_n:
      raise ValueError(
        f"ngram needs 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}"
      )

  def propose(self, params, state, ctx, k, sampling, key):
    tokens_BS, lengths_B = ctx.tokens_BS, ctx.lengths_B
    B, S = tokens_BS.shape
    j_S = jnp.arange(S)
    best_start_B = jnp.full((B,), -1, jnp.int32)
    # Longer n wins: iterate short to long and let every later match overwrite.
    for n in range(self.min_n, self.max_n + 1):
      match_BS = j_S[None, :] + n < lengths_B[:, None]  # a continuation token exists
      for i in range(n):
        suffix_B = jnp.take_along_axis(tokens_BS, (lengths_B - n + i)[:, None] % S, 1)
        shifted_BS = jnp.roll(tokens_BS, -i, axis=1)
        match_BS &= shifted_BS == suffix_B
      match_BS &= (lengths_B >= n + 1)[:, None]
      last_B = jnp.max(jnp.where(match_BS, j_S[None, :], -1), axis=1)
      best_start_B = jnp.where(last_B >= 0, last_B + n, best_start_B)
    idx_BJ = best_start_B[:, None] + jnp.arange(k)[None, :]
    valid_BJ = (best_start_B[:, None] >= 0) & (idx_BJ < lengths_B[:, None])
    draft_BJ = jnp.take_along_axis(tokens_BS, jnp.clip(idx_BJ, 0, S - 1), 1)
    return jnp.where(valid_BJ, draft_BJ, PAD).astype(jnp.int32), None, state

  def validate_tree(self, tree):
    pass  # any tree: a rank with no distinct continuation left is padded

  def propose_tree(self, params, state, ctx, tree, sampling, key):
    tokens_BS, lengths_B = ctx.tokens_BS, ctx.lengths_B
    B, S = tokens_BS.shape
    s_S = jnp.arange(S)
    next_BS = jnp.roll(tokens_BS, -1, axis=1)  # the token after each candidate match end s
    tok_Bn = jnp.zeros((B, tree.size), jnp.int32)
    tok_Bn = tok_Bn.at[:, 0].set(jnp.take_along_axis(tokens_BS, (lengths_B - 1)[:, None], 1)[:, 0])
    for d in range(tree.depth):
      q_m = tree.at_depth(d)
      q_m = q_m[tree.children[q_m, 0] >= 0]  # nodes of depth d with children
      # Each node's suffix, newest first: its path below the root, then the committed context.
      ext_Bm = [self._ext(tokens_BS, lengths_B, tok_Bn, tree, q_m, d, e) for e in range(self.max_n)]
      score_BmS = jnp.full((B, len(q_m), S), -1, jnp.int32)
      for n in range(self.min_n, self.max_n + 1):
        match_BmS = ((s_S >= n - 1) & (s_S + 1 < lengths_B[:, None]))[:, None, :]
        for e in range(n):
          match_BmS &= jnp.roll(tokens_BS, e, axis=1)[:, None, :] == ext_Bm[e][:, :, None]
        score_BmS = jnp.where(match_BmS, n * S + s_S, score_BmS)  # longer n, then later s
      cand_BmS = jnp.broadcast_to(next_BS[:, None, :], score_BmS.shape)
      for r in range(tree.children.shape[1]):
        best_Bm = jnp.argmax(score_BmS, -1)
        found_Bm = jnp.max(score_BmS, -1) >= 0
        pick_Bm = jnp.take_along_axis(cand_BmS, best_Bm[..., None], -1)[..., 0]
        pick_Bm = jnp.where(found_Bm, pick_Bm, NO_TOKEN)  # and so its descendants
        score_BmS = jnp.where(cand_BmS == pick_Bm[..., None], -1, score_BmS)
        child_m = tree.children[q_m, r]
        has = child_m >= 0
        tok_Bn = tok_Bn.at[:, child_m[has]].set(pick_Bm[:, has])
    return tok_Bn[:, 1:], state

  @staticmethod
  def _ext(tokens_BS, lengths_B, tok_Bn, tree, q_m, d, e):
    """[B, m]: token e from the end of each node's suffix (its depth-d path, then the context)."""
    if e < d:
      return tok_Bn[:, tree.path_to[q_m, d - e]]
    at_B = jnp.maximum(lengths_B - 1 - (e - d), 0)
    return jnp.broadcast_to(
      jnp.take_along_axis(tokens_BS, at_B[:, None], 1), (len(lengths_B), len(q_m))
    )

  def commit_tree(self, params, state, ctx, accepted, target):
    return state


def ngram(min_n: int = 1, max_n: int = 4) -> NGram:
  return NGram(min_n=min_n, max_n=max_n)
