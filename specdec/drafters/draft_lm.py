"""An independent small LM as the drafter, with its own KV cache.

Rollback is by length, as for the target: after a step the draft cache is valid up to the accepted
prefix. The next proposal first re-feeds the last two committed tokens (width 2 covers both the
case where the bonus token is new and the case where all k drafts were accepted and d_k was never
fed), then drafts k-1 more tokens one at a time: k draft forwards per step.

Trees: the same re-feed gives the root's logits; each depth then runs one forward over its nodes
that have children, under the tree's mask at the target's node slots, and a node's child of rank
r is the r-th most likely token there: depth forwards per step. The commit moves the accepted
path's K/V to their sequence slots as the target's cache does (only the last accepted node may
lack K/V, and the next re-feed writes it).
"""

import dataclasses

import jax
import jax.numpy as jnp

from specdec.drafters.base import Drafter
from specdec.drafters.heads import pick
from specdec.models.config import HybridConfig
from specdec.models.transformer import KVCache
from specdec.ops.attention import TreeMask


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

  def _refeed(self, params, cache, ctx):
    """The last two committed tokens through the draft LM: its logits at the newest one."""
    pos_B2 = jnp.maximum(ctx.lengths_B[:, None] - 2 + jnp.arange(2), 0)
    tok_B2 = jnp.take_along_axis(ctx.tokens_BS, pos_B2, 1)
    logits_at_B1 = jnp.ones_like(pos_B2[:, :1])
    return self.model.module.apply(params, tok_B2, pos_B2, cache, logits_at_BP=logits_at_B1)

  def propose(self, params, cache, ctx, k, sampling, key):
    module = self.model.module
    lengths_B = ctx.lengths_B
    out = self._refeed(params, cache, ctx)
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

  def validate_tree(self, tree):
    pass  # any tree: the forwards follow its mask

  def propose_tree(self, params, cache, ctx, tree, sampling, key):
    del sampling, key  # children are the draft's top tokens, whatever the target samples
    out = self._refeed(params, cache, ctx)
    cache, logits_BmV = out.cache, out.logits
    root_B = ctx.lengths_B - 1
    B = root_B.shape[0]
    tok_Bn = jnp.zeros((B, tree.size), jnp.int32)
    tok_Bn = tok_Bn.at[:, 0].set(jnp.take_along_axis(ctx.tokens_BS, root_B[:, None], 1)[:, 0])
    width = tree.children.shape[1]
    for d in range(tree.depth):
      q_m = tree.at_depth(d)
      q_m = q_m[tree.children[q_m, 0] >= 0]  # nodes of depth d with children
      if d:
        mask = TreeMask(root_B, q_m, tree.ancestors[q_m])
        pos_Bm = jnp.broadcast_to(root_B[:, None] + d, (B, len(q_m)))
        o = self.model.module.apply(params, tok_Bn[:, q_m], pos_Bm, cache, tree=mask)
        cache, logits_BmV = o.cache, o.logits
      top_Bmo = jax.lax.top_k(logits_BmV, width)[1].astype(jnp.int32)
      for r in range(width):
        child_m = tree.children[q_m, r]
        has = child_m >= 0
        tok_Bn = tok_Bn.at[:, child_m[has]].set(top_Bmo[:, has, r])
    return tok_Bn[:, 1:], cache

  def commit_tree(self, params, cache, ctx, accepted, target):
    return cache.move(accepted.src_BT, accepted.dst_BT)


def draft_lm(model) -> DraftLM:
  return DraftLM(model=model)
