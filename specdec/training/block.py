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

DSpark (a Markov head, sample_from_anchor or a confidence head) follows specforge's objective:
row r of P = `drafts_per_forward` rows predicts position a+r+1 (the anchor row drafts too under
sample_from_anchor); the Markov bias is teacher-forced, each row biased by its TRUE predecessor
(the anchor, then the previous row's label), the rnn state running over every row as at inference;
loss = ce_weight x CE + l1_weight x TV + confidence_weight x BCE, each position-weighted as above,
where TV = sum |softmax(draft) - softmax(target)| at the row's position and the confidence head
(logit over [h] or [h, w1[prev]]) is fitted to the row's acceptance probability 1 - TV / 2. Labels
stay the target's greedy picks (specforge reads the corpus tokens; ours is a self-distilled one).

    loss_fn = make_loss(target, cfg)
    params, _ = fit(loss_fn, init_params(target, cfg, key), batches, steps=n,
                    frozen=frozen_params(target))
    export(path, target, params, cfg)
"""

import jax
import jax.numpy as jnp
import optax

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


def take_rows(x_BTV, at_BAP):
  """x at positions at_BAP of each sequence: [B, A, P, ...]."""
  B, A, P = at_BAP.shape
  x_BXV = jnp.take_along_axis(x_BTV, at_BAP.reshape(B, A * P, *([1] * (x_BTV.ndim - 2))), 1)
  return x_BXV.reshape(B, A, P, *x_BTV.shape[2:])


def _ce(logits_V, label):
  """Cross-entropy over the last axis; any leading axes."""
  logits_V = logits_V.astype(jnp.float32)
  picked = jnp.take_along_axis(logits_V, label[..., None], -1)[..., 0]
  return jax.nn.logsumexp(logits_V, -1) - picked


def dspark(cfg: BlockConfig) -> bool:
  return cfg.markov or cfg.sample_from_anchor or bool(cfg.confidence_head)


def teacher_prev(anchor_BA, label_BAP, first: int):
  """Each of the b rows' predecessor token under teacher forcing [B, A, b]: the anchor for rows
  <= first (a row that does not draft sees the anchor, as at inference), then the label of the
  row before."""
  anchor_BA1 = anchor_BA[:, :, None]
  return jnp.concatenate([anchor_BA1] * (first + 1) + [label_BAP[:, :, :-1]], -1)


def markov_bias(draft: BlockDraft, params, h_BAbD, prev_BAb, first: int):
  """Teacher-forced Markov bias of the drafting rows r >= first: [B, A, b - first, Vd] float32.
  prev_BAb: each row's predecessor token (the rnn state runs over every row)."""
  B, A, b, D = h_BAbD.shape
  cfg = draft.cfg
  state_Xr = jnp.zeros((B * A, cfg.markov_rank), jnp.float32)
  biases = []
  for r in range(b):
    bias_XV, state_Xr = draft.apply(
      params, state_Xr, prev_BAb[:, :, r].reshape(-1), h_BAbD[:, :, r].reshape(-1, D),
      method="markov_bias",
    )  # fmt: skip
    if r >= first:
      biases.append(bias_XV.reshape(B, A, -1))
  return jnp.stack(biases, 2)


def confidence_input(cfg: BlockConfig, params, h_BAPD, prev_BAP):
  """The confidence head's input: [h], or [h, w1[prev]] when its width says so."""
  if cfg.confidence_head == cfg.hidden_size:
    return h_BAPD
  if cfg.markov and cfg.confidence_head == cfg.hidden_size + cfg.markov_rank:
    e_BAPr = params["params"]["markov_head"]["markov_w1"][prev_BAP].astype(h_BAPD.dtype)
    return jnp.concatenate([h_BAPD, e_BAPr], -1)
  raise ValueError(
    f"confidence_head width {cfg.confidence_head} is neither hidden_size {cfg.hidden_size} nor "
    f"hidden_size + markov_rank {cfg.hidden_size + cfg.markov_rank}"
  )


def make_loss(
  target_model,
  cfg: BlockConfig,
  *,
  anchors: int = 8,
  gamma: float | None = None,
  selector_weight: float = 1.0,
  ce_weight: float | None = None,
  l1_weight: float = 0.9,
  confidence_weight: float = 1.0,
):
  """loss_fn(params, frozen, batch, key) -> (loss, metrics) for `cfg` on `target_model`.

  params: the draft variables {"params": ...}; frozen: `frozen_params(target)`; batch: int tokens
  [B, T] (or {"tokens": [B, T]}), T >= b + 1; key: draws the anchors. ce_weight defaults to 1,
  or to specforge's 0.1 for a DSpark drafter (beside l1_weight and confidence_weight, which only a
  DSpark drafter uses). Closes over static configuration only, never arrays.
  """
  tcfg, dtype = target_model.config, target_model.dtype
  if cfg.reduced_vocab:
    raise ValueError(
      f"block training uses the target's LM head: draft_vocab_size {cfg.draft_vocab_size} "
      "(a reduced draft vocabulary) is not trainable here"
    )
  is_dspark = dspark(cfg)
  ce_weight = (0.1 if is_dspark else 1.0) if ce_weight is None else ce_weight
  b, P = cfg.block_size, cfg.drafts_per_forward
  first = b - P  # the first drafting row: 0 under sample_from_anchor, else 1
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
    anchor_BA = jax.random.randint(key, (B, A), 1, T - P + 1, dtype=jnp.int32)
    rows = block_rows(anchor_BA, b)
    anchor_tok_BA = jnp.take_along_axis(tokens_BT, anchor_BA, 1)
    tok_BAb = jnp.where(
      jnp.arange(b) == 0, anchor_tok_BA[:, :, None], jnp.int32(cfg.mask_token_id)
    ).reshape(B, A * b)
    x_BRD = shared.apply(target, tok_BAb, method="embed_tokens")
    h_BRD, _ = draft.apply(params, x_BRD, rows, ctx_k, ctx_v)
    h_BAbD = h_BRD.reshape(B, A, b, -1)
    h_BAPD = h_BAbD[:, :, first:]
    logits_BAPV = shared.apply(target, h_BAPD, method="head")
    at_BAP = anchor_BA[:, :, None] + jnp.arange(P)  # drafting row p's label: the pick after a+p
    label_BAP = take_rows(label_BT, at_BAP)
    prev_BAb = teacher_prev(anchor_tok_BA, label_BAP, first)
    prev_BAP = prev_BAb[:, :, first:]
    if cfg.markov:
      logits_BAPV = logits_BAPV.astype(jnp.float32) + markov_bias(
        draft, params, h_BAbD, prev_BAb, first
      )

    weigh = lambda x_BAP: jnp.mean(jnp.sum(w_P * x_BAP, -1)) / jnp.sum(w_P)  # noqa: E731
    block_loss = weigh(_ce(logits_BAPV, label_BAP))
    ok_BAP = jnp.argmax(logits_BAPV, -1) == label_BAP
    metrics = {
      "block_loss": block_loss,
      "acc_first": jnp.mean(ok_BAP[..., 0]),
      "acc_last": jnp.mean(ok_BAP[..., -1]),
      "tau_block": 1.0 + jnp.mean(jnp.sum(jnp.cumprod(ok_BAP, -1), -1)),
    }
    loss = ce_weight * block_loss
    if is_dspark:
      p_BAPV = jax.nn.softmax(logits_BAPV.astype(jnp.float32), -1)
      t_BAPV = jax.nn.softmax(take_rows(out.logits, at_BAP).astype(jnp.float32), -1)
      tv_BAP = jnp.sum(jnp.abs(p_BAPV - t_BAPV), -1)
      accept_BAP = jax.lax.stop_gradient(jnp.clip(1.0 - 0.5 * tv_BAP, 0.0, 1.0))
      loss = loss + l1_weight * weigh(tv_BAP)
      metrics.update(
        l1_loss=weigh(tv_BAP),
        tau_probabilistic=1.0 + jnp.mean(jnp.sum(jnp.cumprod(accept_BAP, -1), -1)),
      )
      if cfg.confidence_head:
        x_BAPX = confidence_input(cfg, params, h_BAPD, prev_BAP)
        c_BAP = draft.apply(params, x_BAPX, method="confidence").astype(jnp.float32)
        bce_BAP = optax.sigmoid_binary_cross_entropy(c_BAP, accept_BAP)
        loss = loss + confidence_weight * weigh(bce_BAP)
        metrics.update(
          confidence_loss=weigh(bce_BAP),
          confidence_abs_error=weigh(jnp.abs(jax.nn.sigmoid(c_BAP) - accept_BAP)),
          # what a constant predictor (the batch's mean acceptance) would score
          confidence_abs_error_const=weigh(jnp.abs(jnp.mean(accept_BAP) - accept_BAP)),
        )
    if cfg.selector:
      unary_BAPc, cand_BAPc = candidates(jax.lax.stop_gradient(logits_BAPV), cfg.selector_top_k)
      pred_BAP = prev_BAP
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
