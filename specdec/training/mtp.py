"""Training an MTP head by distillation against the frozen target.

The batch is tokens [B, T]. The frozen target runs over it once; pair p (target feature p, token
p+1) learns what the TARGET predicts at position p+1: cross-entropy to its distribution there
(soft) or to its argmax (hard). Either way the head's argmax is pulled to the target's, which is
what greedy verification accepts. Only the head trains: the embedding and LM head are the
target's, read from `frozen`. Master weights are float32 and cast to the target's dtype for the
forward, as in `training/lm.py`.

Training-time test (`ChainTraining.depth` > 1, EAGLE-3's TTT): drafting is replayed from sampled
origins for deeper depths, the head consuming its own outputs as it does when drafting, so the
chained depths are trained too; depth s is weighted decay**s. The chain machinery below is shared
with `training/eagle3.py`.

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
class ChainTraining:
  depth: int = 1  # draft depths trained per origin; 1: only the first (teacher-forced) draft
  origins: int = 64  # origins per row replayed for depths >= 2 (sampled; each copies the cache)
  decay: float = 0.8  # loss weight of depth s is decay**s (EAGLE-3's traineagle3)


@dataclasses.dataclass(frozen=True)
class MTPTrainConfig:
  mtp: mtp_lib.MTPConfig = mtp_lib.MTPConfig()
  soft: bool = True  # CE to the target's distribution; False: to its argmax
  chain: ChainTraining = ChainTraining()


def init_params(target_model, cfg: MTPTrainConfig, key) -> dict:
  return mtp_lib.init_head(target_model.config, cfg.mtp, key, jnp.float32)


def frozen_params(target_model) -> dict:
  return {"target": target_model.params}


def distill_ce(logits_V, teacher_V, soft: bool):
  """Per-position CE of the student to the teacher's distribution (soft) or argmax (hard)."""
  logq_V = jax.nn.log_softmax(logits_V)
  if soft:
    return -jnp.sum(jax.nn.softmax(teacher_V) * logq_V, -1)
  labels = jnp.argmax(teacher_V, -1)
  return -jnp.take_along_axis(logq_V, labels[..., None], -1)[..., 0]


def masked_mean(x, mask):
  mask = mask.astype(jnp.float32)
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def chain_loss(drafter, weights, h_BTD, tokens_BT, teacher_BTV, key, chain, depth_term):
  """Loss and metrics over the draft depths of a chained head.

  depth_term(out [..., D], teacher [..., V], valid [...]) -> (loss, {metric: value}) scores the
  head's outputs against the target's logits for the tokens they predict.
  """
  B, T = tokens_BT.shape
  out_BTD, cache = drafter.teacher_forced(weights, h_BTD, tokens_BT)
  # Pair p predicts token p+2, which the target predicts at position p+1; the last pair has no
  # token p+1.
  terms = [depth_term(out_BTD[:, :-1], teacher_BTV[:, 1:], jnp.ones((B, T - 1), bool))]
  if chain.depth > 1:
    n = min(chain.origins, T - 1)
    origins_BO = jnp.argsort(jax.random.uniform(key, (B, T - 1)), -1)[:, :n].astype(jnp.int32)
    outs = drafter.chained(weights, out_BTD, cache, tokens_BT, origins_BO, chain.depth)
    b_B1 = jnp.arange(B)[:, None]
    for s, out_BOD in enumerate(outs, 1):
      at_BO = origins_BO + s + 1  # the position whose target distribution depth s matches
      teacher_BOV = teacher_BTV[b_B1, jnp.minimum(at_BO, T - 1)]
      terms.append(depth_term(out_BOD, teacher_BOV, at_BO <= T - 1))
  loss = sum(chain.decay**s * t[0] for s, t in enumerate(terms))
  metrics = {f"{k}_d{s + 1}": v for s, (_, m) in enumerate(terms) for k, v in m.items()}
  return loss, {"loss_d1": terms[0][0], **metrics}


def make_loss(target_model, cfg: MTPTrainConfig):
  """loss_fn(params, frozen, tokens_BT, key) -> (loss, metrics) for `training.loop.fit`; it
  closes over static configuration only, never arrays. metrics: loss_d1 and, per depth s,
  agree_d{s}, the rate at which the head's argmax is the target's."""
  config, dtype = target_model.config, target_model.dtype
  drafter = mtp_lib.MTP.build(config, dtype, cfg.mtp)

  def loss_fn(params, frozen, tokens_BT, key):
    out = forward(frozen["target"], tokens_BT, config, dtype, drafter.taps)
    weights = {
      "head": jax.tree.map(lambda p: p.astype(dtype), params),
      "target": mtp_lib.shared_target_params(frozen["target"]),
    }

    def depth_term(out_D, teacher_V, valid):
      logits_V = drafter.logits(weights, out_D)
      ce = distill_ce(logits_V, teacher_V, cfg.soft)
      agree = jnp.argmax(logits_V, -1) == jnp.argmax(teacher_V, -1)
      return masked_mean(ce, valid), {"agree": masked_mean(agree, valid)}

    teacher_BTV = jax.lax.stop_gradient(out.logits)
    h_BTD = drafter.features(weights, out)
    return chain_loss(drafter, weights, h_BTD, tokens_BT, teacher_BTV, key, cfg.chain, depth_term)

  return loss_fn


def drafter(target_model, params, cfg: MTPTrainConfig = MTPTrainConfig()) -> mtp_lib.MTP:
  return mtp_lib.mtp(target_model, params, config=cfg.mtp)


def export(path: str, target_model, params, cfg: MTPTrainConfig = MTPTrainConfig(), dtype=None):
  """Writes the published layout (cfg.mtp.layout) that `mtp.load_mtp` reads back."""
  mtp_lib.save_mtp(path, drafter(target_model, params, cfg), dtype)
