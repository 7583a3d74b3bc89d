"""The block drafter (DFlash family): a whole block of drafts from ONE non-causal forward.

The draft layers read the target's hidden states at `target_layer_ids` (fused by fc + hidden_norm)
as K/V context in every layer, and run the block [anchor, MASK x (b-1)] through the TARGET's
embedding and LM head (shared: they travel in `params["shared"]`, never copied into the draft).
See `block_model.py` for the attention rule and DFlash2's conv and selector.

State: per draft layer a context K/V cache [B, S, K, H], slot s = position s, filled at `init`
from the prompt's taps and at `commit` from the verify forward's taps at positions start..start+k.
Rollback is by length, as for the target: a slot is read only while s < the block's anchor
position (= lengths - 1), and every slot that becomes readable was written by the verify that
committed it; stale slots are masked and later overwritten, never copied.

Draft budget k vs block size b. One forward drafts b-1 tokens (rows 1..b-1; row 0 is the anchor).
  k <= b-1: one forward, the first k drafts are used.
  k >  b-1: ceil(k / (b-1)) forwards, chained: forward j >= 1 is anchored on the last draft of
            forward j-1, at its absolute position start + j(b-1). The target has not computed
            features for positions start .. start + j(b-1) - 1, so those positions are read from
            the earlier forwards of this proposal instead: every draft layer sees, as extra keys,
            the layer's own K/V of the earlier blocks' rows 0..b-2 at their positions (the row
            b-1 of forward j-1 is forward j's anchor position). The context cache is untouched.
            Cost: ceil(k / (b-1)) draft forwards; drafts beyond k are discarded.
This chaining is our choice (the DFlash sources always draft exactly b-1); its acceptance past
b-1 is a measurement, not a promise. With DSpark's sample_from_anchor every row drafts (row r the
token after position start + r), so read b for b-1 above.
"""

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specdec.drafters.base import Drafter
from specdec.drafters.block_config import BlockConfig, make_config
from specdec.drafters.block_model import BlockDraft, Extra, init_variables, single_block_rows
from specdec.drafters.block_select import candidates, pick, predecessors, walk
from specdec.models.transformer import Transformer
from specdec.ops import sampling as sampling_lib
from specdec.ops.kv_cache import write_cache


@flax.struct.dataclass
class BlockState:
  k: tuple[jax.Array, ...]  # per draft layer [B, S, K, H]: context keys (k_norm + RoPE applied)
  v: tuple[jax.Array, ...]
  start: jax.Array  # [B] anchor position of the last proposal = position of verify index 0


@dataclasses.dataclass(frozen=True, eq=False)
class Block(Drafter):
  name = "block"
  target: Any = None  # specdec.Model: config, dtype, and the shared embedding / LM head
  cfg: BlockConfig = None
  draft_params: Any = None  # {"params": ...} of BlockDraft
  draft_ids: Any = None  # int32 [Vd]: target id of each draft id (a reduced-vocabulary draft)

  @property
  def params(self):
    p = self.target.params["params"]
    shared = {name: p[name] for name in ("embed", "lm_head") if name in p}
    out = {"draft": self.draft_params["params"], "shared": shared}
    if self.cfg.reduced_vocab:
      out["draft_ids"] = self.draft_ids
    return out

  @property
  def module(self) -> BlockDraft:
    return BlockDraft(self.cfg)

  def validate(self, target_config, k, slots):
    c, n = self.cfg, target_config.num_layers
    bad = [i for i in c.target_layer_ids if not 0 <= i < n]
    if bad:
      raise ValueError(f"block drafter: target_layer_ids {bad} outside the target's {n} layers")
    if self.taps != c.target_layer_ids:
      raise ValueError(f"block drafter: taps {self.taps} != target_layer_ids {c.target_layer_ids}")
    if c.hidden_size != target_config.hidden_size:
      raise ValueError(
        f"block drafter: hidden_size {c.hidden_size} differs from the target's "
        f"{target_config.hidden_size} (the draft's output goes through the target's LM head)"
      )
    if c.layers.vocab_size != target_config.vocab_size:
      raise ValueError(
        f"block drafter: vocab_size {c.layers.vocab_size} differs from the target's "
        f"{target_config.vocab_size}"
      )
    fc_in = self.draft_params["params"]["fc"]["kernel"].shape[0]
    want = len(c.target_layer_ids) * target_config.hidden_size
    if fc_in != want:
      raise ValueError(
        f"block drafter: fc takes {fc_in} features but {len(c.target_layer_ids)} taps x "
        f"hidden {target_config.hidden_size} = {want}"
      )

  # --- the shared target pieces and the draft network ------------------------------------------

  def _shared(self, params, x, method):
    module = Transformer(self.target.config, self.target.dtype)
    return module.apply({"params": params["shared"]}, x, method=method)

  def _context(self, params, taps, pos_BT):
    x_BTX = jnp.concatenate(taps, -1)
    return self.module.apply({"params": params["draft"]}, x_BTX, pos_BT, method="context")

  def draft_logits(self, params, h_BPD, bias_BPv=None):
    """float32 logits over the TARGET vocabulary from the draft's final hidden: the target's head
    (or the draft's own over a reduced vocabulary, -inf at ids it cannot draft), multiplied by
    `logit_scale`, soft-capped, plus DSpark's Markov bias (over the draft vocabulary)."""
    c = self.cfg
    if c.reduced_vocab:
      x = self.module.apply({"params": params["draft"]}, h_BPD, method="draft_head")
    else:
      x = self._shared(params, h_BPD, "head")
    if c.logit_scale != 1.0:
      x = x * c.logit_scale
    if c.logit_softcap:
      x = c.logit_softcap * jnp.tanh(x / c.logit_softcap)
    if bias_BPv is not None:
      x = x + bias_BPv
    if not c.reduced_vocab:
      return x
    full_BPV = jnp.full(x.shape[:-1] + (c.layers.vocab_size,), -jnp.inf)
    return full_BPV.at[..., params["draft_ids"]].set(x)

  def _forward(self, params, st, token_B, start_B, extra, sampling, key):
    """One block anchored at `start` on `token`: (drafts [B, b-1], q or None, row K/V, rows)."""
    c, b = self.cfg, self.cfg.block_size
    B = token_B.shape[0]
    tok_Bb = jnp.concatenate(
      [token_B[:, None], jnp.full((B, b - 1), c.mask_token_id, jnp.int32)], 1
    )
    rows = single_block_rows(start_B, b)
    x_BbD = self._shared(params, tok_Bb, "embed_tokens")
    if c.embed_scale != 1.0:
      x_BbD = (x_BbD * c.embed_scale).astype(x_BbD.dtype)
    variables = {"params": params["draft"]}
    h_BbD, kv = self.module.apply(variables, x_BbD, rows, st.k, st.v, extra)
    if c.markov:
      d_BP, logits_BPV = self._markov_walk(params, h_BbD, token_B, sampling, key)
      q_BPV = None if sampling.greedy else sampling_lib.probs(logits_BPV, sampling)
      return d_BP, q_BPV, kv, rows
    h_BPD = h_BbD if c.sample_from_anchor else h_BbD[:, 1:]
    logits_BPV = self.draft_logits(params, h_BPD)
    if not c.selector:
      d_BP, q_BPV = pick(logits_BPV, sampling, key)
      return d_BP, q_BPV, kv, rows
    unary_BPc, cand_BPc = candidates(logits_BPV, c.selector_top_k)
    pred_BPc = predecessors(token_B, cand_BPc)
    pair_BPcc = self.module.apply(variables, h_BPD, pred_BPc, cand_BPc, method="select")
    edge_BPcc = unary_BPc[:, :, None, :] + pair_BPcc
    d_BP, q_BPV = walk(edge_BPcc, cand_BPc, logits_BPV.shape[-1], sampling, key)
    return d_BP, q_BPV, kv, rows

  def _markov_walk(self, params, h_BbD, token_B, sampling, key):
    """DSpark: rows in order, each row's logits biased by the token before the one it drafts
    (the anchor, then the previous row's draft); the rnn state runs over every row, the anchor
    row included even when it does not draft. Returns (drafts [B, P], their logits [B, P, V])."""
    c, B = self.cfg, token_B.shape[0]
    first = 0 if c.sample_from_anchor else 1
    variables = {"params": params["draft"]}
    state_Br = jnp.zeros((B, c.markov_rank), jnp.float32)
    prev_B, drafts, logits = token_B, [], []
    for r, key_r in enumerate(jax.random.split(key, c.block_size)):
      h_B1D = h_BbD[:, r : r + 1]
      bias_Bv, state_Br = self.module.apply(
        variables, state_Br, prev_B, h_B1D[:, 0], method="markov_bias"
      )
      if r < first:
        continue
      logits_B1V = self.draft_logits(params, h_B1D, bias_Bv[:, None])
      d_B1, _ = pick(logits_B1V, sampling, key_r)
      prev_B = d_B1[:, 0]
      drafts.append(d_B1)
      logits.append(logits_B1V)
    return jnp.concatenate(drafts, 1), jnp.concatenate(logits, 1)

  # --- the protocol ------------------------------------------------------------------------------

  def init(self, params, prompt_BT, lengths_B, target):
    B, T = prompt_BT.shape
    c = self.cfg.layers
    pos_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    ks, vs = self._context(params, target.taps, pos_BT)
    zeros = jnp.zeros((B, target.cache.slots, c.num_kv_heads, c.head_dim), self.target.dtype)
    return BlockState(
      k=tuple(write_cache(zeros, k, pos_BT) for k in ks),
      v=tuple(write_cache(zeros, v, pos_BT) for v in vs),
      start=lengths_B,
    )

  def propose(self, params, st, ctx, k, sampling, key):
    P = self.cfg.drafts_per_forward
    B = ctx.lengths_B.shape[0]
    start_B = ctx.lengths_B - 1
    token_B = ctx.tokens_BS[jnp.arange(B), start_B]
    drafts, qs, extra = [], [], None
    n_blocks = -(-k // P)
    for j, key_j in enumerate(jax.random.split(key, n_blocks)):
      d_BP, q_BPV, (ks, vs), rows = self._forward(
        params, st, token_B, start_B + j * P, extra, sampling, key_j
      )
      drafts.append(d_BP)
      qs.append(q_BPV)
      token_B = d_BP[:, -1]
      if j + 1 < n_blocks:
        new = Extra(tuple(x[:, :P] for x in ks), tuple(x[:, :P] for x in vs), rows.pos_BR[:, :P])
        extra = (
          new
          if extra is None
          else jax.tree.map(lambda a, b: jnp.concatenate([a, b], 1), extra, new)
        )
    draft_BJ = jnp.concatenate(drafts, 1)[:, :k]
    q_BJV = None if qs[0] is None else jnp.concatenate(qs, 1)[:, :k]
    return draft_BJ, q_BJV, st.replace(start=start_B)

  def commit(self, params, st, ctx, n_acc_B, target):
    T = target.taps[0].shape[1]  # the verify's k+1 positions
    pos_BT = st.start[:, None] + jnp.arange(T, dtype=jnp.int32)
    ks, vs = self._context(params, target.taps, pos_BT)
    return st.replace(
      k=tuple(write_cache(c, n, pos_BT) for c, n in zip(st.k, ks, strict=True)),
      v=tuple(write_cache(c, n, pos_BT) for c, n in zip(st.v, vs, strict=True)),
    )


def block(
  target,
  draft_params=None,
  cfg: BlockConfig | None = None,
  *,
  sliding_window: int | None = None,
  seed: int = 0,
  draft_ids=None,
  **config_kw,
) -> Block:
  """A block drafter for `target` (a specdec.Model).

  draft_params: {"params": ...} from `specdec.training.block.init_params`, a trained run or
    `load_block`; None draws random weights (seed), useful only for plumbing tests.
  cfg: a BlockConfig; None builds one with `make_config(target.config, **config_kw)` (num_layers,
    block_size, target_layer_ids, mask_token_id, conv, selector, ...).
  sliding_window: overrides every draft layer's attention window (None keeps the config's).
  draft_ids: int [Vd], the target id of each draft id, for a reduced-vocabulary draft
    (cfg.draft_vocab_size > 0, e.g. from a speculators checkpoint's d2t).
  """
  if cfg is None:
    cfg = make_config(target.config, **config_kw)
  elif config_kw:
    raise ValueError(f"pass either cfg or config keywords, not both: {sorted(config_kw)}")
  if sliding_window is not None:
    cfg = cfg.replace(windows=(int(sliding_window),) * cfg.layers.num_layers).check()
  if draft_params is None:
    key = jax.random.key(seed)
    draft_params = init_variables(cfg, key, target.dtype, target.config.hidden_size)
  draft_params = jax.tree.map(lambda p: jnp.asarray(p, target.dtype), draft_params)
  if cfg.reduced_vocab:
    if draft_ids is None or len(draft_ids) != cfg.draft_vocab_size:
      raise ValueError(
        f"block drafter: draft_vocab_size {cfg.draft_vocab_size} needs draft_ids (d2t) of that "
        "length"
      )
    draft_ids = jnp.asarray(draft_ids, jnp.int32)
  elif draft_ids is not None:
    raise ValueError("block drafter: draft_ids given but the config has the full vocabulary")
  return Block(
    taps=cfg.target_layer_ids,
    target=target,
    cfg=cfg,
    draft_params=draft_params,
    draft_ids=draft_ids,
  )
