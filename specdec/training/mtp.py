"""Training an MTP head by distillation against the frozen target.

The batch is tokens [B, T]. The frozen target runs over it once; pair p (target feature p, token
p+1) learns what the TARGET predicts at position p+1: cross-entropy to its distribution there
(soft) or to its argmax (hard). Either way the head's argmax is pulled to the target's, which is
what greedy verification accepts. Only the head trains: the embedding and LM head are the
target's, read from `frozen`. Master weights are float32 and cast to the target's dtype for the
forward, as in `training/lm.py`.

    loss_fn = make_loss(target, cfg)
    params, _ = fit(loss_fn, init_params(target, cfg, key), batches, steps=n,
                    frozen=frozen_params(target))
    export(path, target, params, cfg)
"""

import dataclasses

import jax
import jax.numpy as jnp

from specdec.drafters import mtp as mtp_lib
from specdec.model import forward


@dataclasses.dataclass(frozen=True)
class MTPTrainConfig:
  mtp: mtp_lib.MTPConfig = mtp_lib.MTPConfig()
  soft: bool = True  # CE to the target's distribution; False: to its argmax


def init_params(target_model, cfg: MTPTrainConfig, key) -> dict:
  return mtp_lib.init_head(target_model.config, cfg.mtp, key, jnp.float32)


def frozen_params(target_model) -> dict:
  return {"target": target_model.params}


def distill_ce(logits_BTV, teacher_BTV, soft: bool):
  """Per-position CE of the student to the teacher's distribution (soft) or argmax (hard)."""
  logq_BTV = jax.nn.log_softmax(logits_BTV)
  if soft:
    return -jnp.sum(jax.nn.softmax(teacher_BTV) * logq_BTV, -1)
  labels_BT = jnp.argmax(teacher_BTV, -1)
  return -jnp.take_along_axis(logq_BTV, labels_BT[..., None], -1)[..., 0]


def make_loss(target_model, cfg: MTPTrainConfig):
  """loss_fn(params, frozen, tokens_BT, key) -> (loss, metrics) for `training.loop.fit`; it
  closes over static configuration only, never arrays."""
  config, dtype = target_model.config, target_model.dtype
  drafter = mtp_lib.MTP.build(config, dtype, cfg.mtp)

  def loss_fn(params, frozen, tokens_BT, key):
    del key  # no dropout
    out = forward(frozen["target"], tokens_BT, config, dtype, drafter.taps)
    teacher_BTV = jax.lax.stop_gradient(out.logits)
    weights = {
      "head": jax.tree.map(lambda p: p.astype(dtype), params),
      "target": mtp_lib.shared_target_params(frozen["target"]),
    }
    h_BTD = drafter.features(weights, out)
    out_BTD, _ = drafter.teacher_forced(weights, h_BTD, tokens_BT)
    # Pair p predicts token p+2, which the target predicts at position p+1; the last pair has no
    # token p+1.
    logits_BTV = drafter.logits(weights, out_BTD)[:, :-1]
    teacher_BTV = teacher_BTV[:, 1:]
    ce_BT = distill_ce(logits_BTV, teacher_BTV, cfg.soft)
    agree_BT = jnp.argmax(logits_BTV, -1) == jnp.argmax(teacher_BTV, -1)
    loss = jnp.mean(ce_BT)
    return loss, {"ce": loss, "agree": jnp.mean(agree_BT.astype(jnp.float32))}

  return loss_fn


def drafter(target_model, params, cfg: MTPTrainConfig = MTPTrainConfig()) -> mtp_lib.MTP:
  return mtp_lib.mtp(target_model, params, config=cfg.mtp)


def export(path: str, target_model, params, cfg: MTPTrainConfig = MTPTrainConfig(), dtype=None):
  """Writes the published layout (cfg.mtp.layout) that `mtp.load_mtp` reads back."""
  mtp_lib.save_mtp(path, drafter(target_model, params, cfg), dtype)
