"""A drafter that knows the answer: acceptance under control, for benchmarks and tests.

It is given each row's tokens by position (the prompt, then the target's greedy continuation)
and drafts them, each draft wrong with a set probability per position, so under greedy
acceptance the accepted counts follow that probability exactly and any acceptance profile along a
request can be staged on a target whose own drafters would accept nothing (random weights).

Chains: the draft for position s is the answer with probability 1 - miss[s], else a wrong token.
Trees emulate a top-k drafter: of one node's children, rank 0 carries the answer with probability
1 - miss[s], rank r > 0 only if every smaller rank missed, and then with probability
(1 - miss[s]) * rank_scale**r; siblings always hold distinct tokens (a wrong one at rank r is
answer + 1 + r, modulo the vocabulary). The answer, the miss rates and rank_scale are params,
so oracles of one vocabulary share compiled steps whatever their profile.

Shapes: B rows, S positions of the answer (slots of the token buffer), J drafts or drafted nodes.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specdec.drafters.base import Drafter


@dataclasses.dataclass(frozen=True)
class Oracle(Drafter):
  name = "oracle"
  vocab: int = 0
  answer: object = dataclasses.field(default=None, compare=False)  # [B, S] int32 tokens
  miss: object = dataclasses.field(default=None, compare=False)  # [B, S] float32 per position
  rank_scale: float = dataclasses.field(default=0.5, compare=False)

  @property
  def params(self):
    return jnp.asarray(self.answer), jnp.asarray(self.miss), jnp.float32(self.rank_scale)

  def validate(self, target_config, k, slots):
    if self.vocab != target_config.vocab_size:
      raise ValueError(
        f"oracle: vocab {self.vocab} differs from the target's {target_config.vocab_size}"
      )

  def propose(self, params, state, ctx, k, sampling, key):
    chain = np.arange(k + 1, dtype=np.int32)  # node 0 the root, node j+1 the j-th draft
    zeros = np.zeros(k, np.int32)
    return self._draft(params, ctx.lengths_B, chain[1:], zeros, chain[:-1], key), None, state

  def validate_tree(self, tree):
    if tree.children.shape[1] >= self.vocab:
      raise ValueError(
        f"oracle: a node of {tree.children.shape[1]} children needs more than the "
        f"{self.vocab} distinct tokens of the vocabulary"
      )

  def propose_tree(self, params, state, ctx, tree, sampling, key):
    ranks = np.asarray([p[-1] for p in tree.paths], np.int32)
    return self._draft(params, ctx.lengths_B, tree.depths[1:], ranks, tree.parents[1:], key), state

  def commit_tree(self, params, state, ctx, accepted, target):
    return state

  def _draft(self, params, lengths_B, depths_J, ranks_J, parents_J, key):
    """One token per drafted node of depth d (position root + d), rank r among its siblings."""
    answer_BS, miss_BS, rank_scale = params
    pos_BJ = jnp.clip(lengths_B[:, None] - 1 + depths_J[None, :], 0, answer_BS.shape[1] - 1)
    want_BJ = jnp.take_along_axis(answer_BS, pos_BJ, 1)
    p_hit_BJ = (1.0 - jnp.take_along_axis(miss_BS, pos_BJ, 1)) * rank_scale**ranks_J
    hit_BJ = jax.random.uniform(key, want_BJ.shape) >= 1.0 - p_hit_BJ  # a chain: u >= miss
    # A top-k drafter lists the target's token at most once: the smallest rank that hits has it.
    before_JJ = (parents_J[:, None] == parents_J[None, :]) & (ranks_J[None, :] < ranks_J[:, None])
    shadowed_BJ = jnp.any(hit_BJ[:, None, :] & before_JJ[None], -1)
    wrong_BJ = (want_BJ + 1 + ranks_J) % self.vocab
    return jnp.where(hit_BJ & ~shadowed_BJ, want_BJ, wrong_BJ).astype(jnp.int32)


def oracle(rows, vocab: int, miss=0.0, rank_scale: float = 0.5) -> Oracle:
  """An oracle for `rows` (per batch row, its tokens by position: prompt, then the answer).

  miss: the probability that a draft is wrong, one number or per row and position an array
  broadcastable to [B, S] (S the longest row; `miss_profile` builds one that changes along the
  request). rank_scale: how much less likely each further rank of a tree's node is to hold the
  answer once the ranks before it missed.
  """
  B, S = len(rows), max(len(r) for r in rows)
  answer_BS = np.zeros((B, S), np.int32)
  for b, r in enumerate(rows):
    answer_BS[b, : len(r)] = r
  miss_BS = np.broadcast_to(np.asarray(miss, np.float32), (B, S)).copy()
  if miss_BS.min() < 0 or miss_BS.max() > 1:
    raise ValueError(
      f"oracle: miss probabilities must lie in [0, 1], got {miss_BS.min()} to {miss_BS.max()}"
    )
  if not 0 <= rank_scale <= 1:
    raise ValueError(f"oracle: rank_scale must lie in [0, 1], got {rank_scale}")
  return Oracle(vocab=vocab, answer=answer_BS, miss=miss_BS, rank_scale=float(rank_scale))


def miss_profile(prompt_lengths, slots: int, early: float, late: float, switch: int) -> np.ndarray:
  """[B, S] miss rates: `early` for the first `switch` generated positions of each row, `late`
  from there on (acceptance that changes along the request)."""
  s_S = np.arange(slots)
  generated_BS = s_S[None, :] - np.asarray(prompt_lengths)[:, None]
  return np.where(generated_BS < switch, early, late).astype(np.float32)
