"""Prompt lookup: propose the tokens that followed the most recent earlier occurrence of the
longest suffix (n in [min_n, max_n]) of the committed context. Fixed-shape search over the whole
token buffer on the device; proposals that would run past the committed context are padded."""

import dataclasses

import jax.numpy as jnp

from specdec.drafters.base import Drafter

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


def ngram(min_n: int = 1, max_n: int = 4) -> NGram:
  return NGram(min_n=min_n, max_n=max_n)
