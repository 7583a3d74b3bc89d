"""Training an EAGLE-3 head by distillation against the frozen target.

The batch is tokens [B, T]. The frozen target runs over it once with the three taps; pair p
(fused taps at p, token p+1) learns the target's distribution at p+1 restricted to the draft
vocabulary, and positions whose target argmax lies outside the draft vocabulary are left out of
the loss (EAGLE-3's `traineagle3/cnets.py` does both). fc, the layer, the norm and the draft LM
head train; the embedding is the target's, frozen. The draft vocabulary is fixed before training
(`eagle3.draft_vocab_from_tokens` on the corpus) and travels in `frozen`.

Training-time test (feeding the head its own outputs for several steps during training) is not
implemented: deeper drafts chain features the layer never saw in training.

    loss_fn = make_loss(target, cfg)
    params, _ = fit(loss_fn, init_params(target, cfg, key), batches, steps=n,
                    frozen=frozen_params(target, draft_ids))
    export(path, target, params, cfg, draft_ids)
"""

import dataclasses

import jax
import jax.numpy as jnp

from specdec.drafters import eagle3 as eagle3_lib
from specdec.model import forward


@dataclasses.dataclass(frozen=True)
class Eagle3TrainConfig:
  draft_vocab_size: int | None = None  # None: the target's whole vocabulary
  aux_layer_ids: tuple[int, ...] | None = None  # None: EAGLE-3's (2, L//2, L-3)
  intermediate_size: int | None = None  # None: the target's
  norm_before_residual: bool = False


def head_config(target_model, cfg: Eagle3TrainConfig) -> eagle3_lib.Eagle3Config:
  return eagle3_lib.make_config(
    target_model.config,
    draft_vocab_size=cfg.draft_vocab_size,
    aux_layer_ids=cfg.aux_layer_ids,
    intermediate_size=cfg.intermediate_size,
    norm_before_residual=cfg.norm_before_residual,
  )


def init_params(target_model, cfg: Eagle3TrainConfig, key) -> dict:
  return eagle3_lib.init_head(head_config(target_model, cfg), key, jnp.float32)


def frozen_params(target_model, draft_ids) -> dict:
  return {"target": target_model.params, "draft_ids": jnp.asarray(draft_ids, jnp.int32)}


def make_loss(target_model, cfg: Eagle3TrainConfig):
  """loss_fn(params, frozen, tokens_BT, key) -> (loss, metrics) for `training.loop.fit`; it
  closes over static configuration only, never arrays."""
  config, dtype = target_model.config, target_model.dtype
  spec = head_config(target_model, cfg)
  drafter = eagle3_lib.Eagle3(taps=spec.taps, head_config=spec.head, dtype=dtype, spec=spec)

  def loss_fn(params, frozen, tokens_BT, key):
    del key  # no dropout
    out = forward(frozen["target"], tokens_BT, config, dtype, drafter.taps)
    ids_Vd = frozen["draft_ids"]
    weights = {
      "head": jax.tree.map(lambda p: p.astype(dtype), params),
      "embed": frozen["target"]["params"]["embed"]["embedding"],
      "draft_ids": ids_Vd,
    }
    out_BTD, _ = drafter.teacher_forced(weights, drafter.features(weights, out), tokens_BT)
    # Pair p predicts token p+2, which the target predicts at position p+1.
    logits_BTVd = drafter.draft_logits(weights, out_BTD)[:, :-1]
    teacher_BTV = jax.lax.stop_gradient(out.logits[:, 1:])
    target_BT = jnp.argmax(teacher_BTV, -1)
    in_vocab_BT = jnp.zeros(config.vocab_size, bool).at[ids_Vd].set(True)[target_BT]
    p_BTVd = jax.nn.softmax(teacher_BTV[..., ids_Vd])
    ce_BT = -jnp.sum(p_BTVd * jax.nn.log_softmax(logits_BTVd), -1)
    mask_BT = in_vocab_BT.astype(jnp.float32)
    loss = jnp.sum(ce_BT * mask_BT) / jnp.maximum(jnp.sum(mask_BT), 1.0)
    agree_BT = ids_Vd[jnp.argmax(logits_BTVd, -1)] == target_BT
    return loss, {
      "ce": loss,
      "agree": jnp.mean(agree_BT.astype(jnp.float32)),  # over all positions: first-draft hit rate
      "in_vocab": jnp.mean(mask_BT),
    }

  return loss_fn


def drafter(target_model, params, cfg: Eagle3TrainConfig, draft_ids) -> eagle3_lib.Eagle3:
  spec = head_config(target_model, cfg)
  return eagle3_lib.eagle3(target_model, params, config=spec, draft_ids=draft_ids)


def export(path: str, target_model, params, cfg: Eagle3TrainConfig, draft_ids, dtype=None):
  """Writes the published EAGLE-3 layout that `eagle3.load_eagle3` reads back."""
  eagle3_lib.save_eagle3(path, drafter(target_model, params, cfg, draft_ids), dtype)
