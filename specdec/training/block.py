"""Distilling a block drafter (DFlash, DFlash2) from a frozen target.

Blocks. Per sequence, `anchors` positions a are drawn uniformly, with replacement, from
[1, T - b + 1] (every block has context and every row a label). Each becomes a block
[tokens[a], MASK x (b-1)] at positions a .. a+b-1 that sees the target's context features at
positions < a and its own rows, never another block: the attention rule of inference
(`specdec.drafters.block_model`), so one draft forward trains A blocks per sequence.

Labels. Row i (1 <= i < b) predicts the target's greedy next token after position a+i-1, i.e.
argmax of the target's logits there given the corpus prefix. On a corpus of the target's own greedy
output these are the tokens the verifier accepts, and `tau_block` below is exactly the mean
accepted length (bonus included) of a k = b-1 proposal at a random anchor.

Loss. sum_i w_i CE_i / sum_i w_i with w_i = exp(-(i-1) / gamma) (DFlash Eq. 4: an early miss voids
every later draft); gamma defaults to the paper's 7 / 5 / 4 for b = 16 / 10 / 8, else (b-1)/2.
DFlash2 adds `selector_weight` x the selector CE over the top-k candidates of the draft's own
logits, score_c = U_i(c) + <A(y_{i-1}) * H(h_i), B(c)> with the TRUE predecessor y_{i-1} (the
anchor for i = 1), with the same position weights; rows whose true token is not a candidate are
left out (`candidate_recall`), and U is held fixed in this term (our choice: the unary logits are
the block CE's job).

    loss_fn = make_loss(target, cfg)
    params, _ = fit(loss_fn, init_params(target, cfg, key), batches, steps=n,
                    frozen=frozen_params(target))
    export(path, target, params, cfg)
"""

import jax
import jax.numpy as jnp

from specdec.drafters.block import Block, block
from specdec.drafters.block_config import BlockConfig, default_gamma
from specdec.drafters.block_io import save_block
from specdec.drafters.block_model import BlockDraft, Rows, init_variables
from specdec.drafters.block_select import candidates
from specdec.model import forward
from specdec.models.transformer import Transformer


def init_params(target_model, cfg: BlockConfig, key):
  """Fresh float32 master weights {"params": ...} (DFlash2's conv starts as the identity, so a new
  DFlash2 drafter starts as a DFlash one); the loss casts them to the target's dtype."""
  return init_variables(cfg, key, jnp.float32, target_model.config.hidden_size)


def frozen_params(target_model) -> dict:
  return {"target": target_model.params}


def drafter(target_model, params, cfg: BlockConfig) -> Block:
  return block(target_model, params, cfg)


def export(
  path: str, target_model, params, cfg: BlockConfig, dtype=None, format: str = "z-lab"
) -> None:
  """A published DFlash / DFlash2 layout (config.json + model.safetensors): z-lab's, or
  "speculators" (vLLM loads it unchanged)."""
  save_block(path, cfg, params, dtype or target_model.dtype, format=format)


def block_rows(anchor_BA, b: int) -> Rows:
  """A blocks of b rows per sequence, laid out block after block."""
  B, A = anchor_BA.shape
  off_BAb = jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32), (B, A, b))
  anchor_BAb = jnp.broadcast_to(anchor_BA[:, :, None], (B, A, b))
  block_BAb = jnp.broadcast_to(jnp.arange(A, dtype=jnp.int32)[None, :, None], (B, A, b))
  flat = lambda x: x.reshape(B, A * b)
  return Rows(flat(anchor_BAb + off_BAb), flat(anchor_BAb), flat(block_BAb), flat(off_BAb))


def _ce(logits_V, label):
  """Cross-entropy over the last axis; any leading axes."""
  logits_V = logits_V.astype(jnp.float32)
  picked = jnp.take_along_axis(logits_V, label[..., None], -1)[..., 0]
  return jax.nn.logsumexp(logits_V, -1) - picked


def make_loss(
  target_model,
  cfg: BlockConfig,
  *,
  anchors: int = 8,
  gamma: float | None = None,
  selector_weight: float = 1.0,
):
  """loss_fn(params, frozen, batch, key) -> (loss, metrics) for `cfg` on `target_model`.

  params: the draft variables {"params": ...}; frozen: `frozen_params(target)`; batch: int tokens
  [B, T] (or {"tokens": [B, T]}), T >= b + 1; key: draws the anchors. Closes over static
  configuration only, never arrays.
  """
  tcfg, dtype = target_model.config, target_model.dtype
  b, P = cfg.block_size, cfg.block_size - 1
  w_P = jnp.exp(-jnp.arange(P, dtype=jnp.float32) / (gamma or default_gamma(b)))
  draft, shared = BlockDraft(cfg), Transformer(tcfg, dtype)

  def loss_fn(params, frozen, batch, key):
    tokens_BT = jnp.asarray(batch["tokens"] if isinstance(batch, dict) else batch, jnp.int32)
    B, T = tokens_BT.shape
    if T < b + 1:
      raise ValueError(f"block training needs sequences of >= block_size + 1 = {b + 1} tokens")
    params = jax.tree.map(lambda p: p.astype(dtype), params)
    target = frozen["target"]
    out = jax.lax.stop_gradient(forward(target, tokens_BT, tcfg, dtype, cfg.target_layer_ids))
    label_BT = jnp.argmax(out.logits, -1).astype(jnp.int32)
    pos_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    ctx_k, ctx_v = draft.apply(params, jnp.concatenate(out.taps, -1), pos_BT, method="context")

    A = anchors
    anchor_BA = jax.random.randint(key, (B, A), 1, T - b + 2, dtype=jnp.int32)
    rows = block_rows(anchor_BA, b)
    anchor_tok_BA = jnp.take_along_axis(tokens_BT, anchor_BA, 1)
    tok_BAb = jnp.where(
      jnp.arange(b) == 0, anchor_tok_BA[:, :, None], jnp.int32(cfg.mask_token_id)
    ).reshape(B, A * b)
    x_BRD = shared.apply(target, tok_BAb, method="embed_tokens")
    h_BRD, _ = draft.apply(params, x_BRD, rows, ctx_k, ctx_v)
    h_BAPD = h_BRD.reshape(B, A, b, -1)[:, :, 1:]
    logits_BAPV = shared.apply(target, h_BAPD, method="head")
    at_BAP = anchor_BA[:, :, None] + jnp.arange(P)  # row i's label is the target's pick after a+i-1
    label_BAP = jnp.take_along_axis(label_BT, at_BAP.reshape(B, A * P), 1).reshape(B, A, P)

    ce_BAP = _ce(logits_BAPV, label_BAP)
    block_loss = jnp.mean(jnp.sum(w_P * ce_BAP, -1)) / jnp.sum(w_P)
    ok_BAP = jnp.argmax(logits_BAPV, -1) == label_BAP
    metrics = {
      "block_loss": block_loss,
      "acc_first": jnp.mean(ok_BAP[..., 0]),
      "acc_last": jnp.mean(ok_BAP[..., -1]),
      "tau_block": 1.0 + jnp.mean(jnp.sum(jnp.cumprod(ok_BAP, -1), -1)),
    }
    loss = block_loss
    if cfg.selector:
      unary_BAPc, cand_BAPc = candidates(jax.lax.stop_gradient(logits_BAPV), cfg.selector_top_k)
      pred_BAP = jnp.concatenate([anchor_tok_BA[:, :, None], label_BAP[:, :, :-1]], -1)
      c = cfg.selector_top_k
      pair = draft.apply(
        params,
        h_BAPD.reshape(B * A, P, -1),
        pred_BAP.reshape(B * A, P, 1),
        cand_BAPc.reshape(B * A, P, c),
        method="select",
      )
      score_BAPc = unary_BAPc + pair.reshape(B, A, P, c)
      hit_BAPc = cand_BAPc == label_BAP[..., None]
      has_BAP = jnp.any(hit_BAPc, -1)
      sel_ce_BAP = _ce(score_BAPc, jnp.argmax(hit_BAPc, -1))
      wh_BAP = w_P * has_BAP
      sel_loss = jnp.sum(wh_BAP * sel_ce_BAP) / jnp.maximum(jnp.sum(wh_BAP), 1e-6)
      loss = loss + selector_weight * sel_loss
      sel_ok = (jnp.argmax(score_BAPc, -1) == jnp.argmax(hit_BAPc, -1)) & has_BAP
      metrics.update(
        selector_loss=sel_loss,
        candidate_recall=jnp.mean(has_BAP),
        selector_acc=jnp.sum(sel_ok) / jnp.maximum(jnp.sum(has_BAP), 1),
      )
    return loss, metrics

  return loss_fn
