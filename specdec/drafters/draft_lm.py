"""An independent small LM as the drafter, with its own KV cache.

Rollback is by length, as for the target: after a step the draft cache is valid up to the accepted
prefix. The next proposal first re-feeds the last two committed tokens (width 2 covers both the
case where the bonus token is new and the case where all k drafts were accepted and d_k was never
fed), then drafts k-1 more tokens one at a time: k draft forwards per step.
"""

import dataclasses

import jax
import jax.numpy as jnp

from specdec.drafters.base import Drafter
from specdec.drafters.heads import pick
from specdec.models.config import HybridConfig
from specdec.models.transformer import KVCache


@dataclasses.dataclass(frozen=True, eq=False)
class DraftLM(Drafter):
  name = "draft_lm"
  model: object = None  # specdec.Model

  @property
  def params(self):
    return self.model.params

  def validate(self, target_config, k, slots):
    if isinstance(self.model.config, HybridConfig):
      raise ValueError(
        f"draft_lm: a {self.model.config.model_type} draft model keeps recurrent state, which "
        "rollback by length cannot undo; use an attention-only draft model"
      )
    dv, tv = self.model.config.vocab_size, target_config.vocab_size
    if dv != tv:
      raise ValueError(f"draft_lm vocabulary ({dv}) differs from the target's ({tv})")

  def init(self, params, prompt_BT, lengths_B, target):
    B, T = prompt_BT.shape
    slots = target.cache.slots
    cache = KVCache.zeros(self.model.config, B, slots, self.model.dtype)
    positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    last_B1 = (lengths_B - 1)[:, None]
    return self.model.module.apply(
      params, prompt_BT, positions_BT, cache, logits_at_BP=last_B1
    ).cache

  def propose(self, params, cache, ctx, k, sampling, key):
    module = self.model.module
    tokens_BS, lengths_B = ctx.tokens_BS, ctx.lengths_B
    pos_B2 = jnp.maximum(lengths_B[:, None] - 2 + jnp.arange(2), 0)
    tok_B2 = jnp.take_along_axis(tokens_BS, pos_B2, 1)
    out = module.apply(params, tok_B2, pos_B2, cache, logits_at_BP=jnp.ones_like(pos_B2[:, :1]))
    keys = jax.random.split(key, k)
    d_B, q_BV = pick(keys[0], out.logits[:, 0], sampling)

    def one(carry, key_i):
      cache, d_B, pos_B = carry
      o = module.apply(params, d_B[:, None], pos_B[:, None], cache)
      nd_B, nq_BV = pick(key_i, o.logits[:, 0], sampling)
      return (o.cache, nd_B, pos_B + 1), (nd_B, nq_BV)

    (cache, _, _), (rest_JB, rest_JBV) = jax.lax.scan(one, (out.cache, d_B, lengths_B), keys[1:])
    draft_BJ = jnp.concatenate([d_B[:, None], rest_JB.T], 1)
    q_BJV = jnp.concatenate([q_BV[:, None], jnp.swapaxes(rest_JBV, 0, 1)], 1)
    return draft_BJ, q_BJV, cache


def draft_lm(model) -> DraftLM:
  return DraftLM(model=model)
