"""Training an EAGLE-3 head by distillation against the frozen target.

The batch is tokens [B, T]. The frozen target runs over it once with the three taps; pair p
(fused taps at p, token p+1) learns the target's distribution at p+1 restricted to the draft
vocabulary, and positions whose target argmax lies outside the draft vocabulary are left out of
the loss (EAGLE-3's `traineagle3/cnets.py` does both). fc, the layer, the norm and the draft LM
head train; the embedding is the target's, frozen. The draft vocabulary is fixed before training
(`eagle3.draft_vocab_from_tokens` on the corpus) and travels in `frozen`.

Training-time test (`chain.depth` > 1) replays drafting from sampled origins so the layer also
learns to read its own outputs, which it is fed in place of fc(taps) from the second draft on:
without it the second draft is rarely right (on the toy world of the tests: never).

    loss_fn = make_loss(target, cfg)
    params, _ = fit(loss_fn, init_params(target, cfg, key), batches, steps=n,
                    frozen=frozen_params(target, draft_ids))
    export(path, target, params, cfg, draft_ids)
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specdec.drafters import eagle3 as eagle3_lib
from specdec.model import forward
from specdec.training.mtp import ChainTraining, chain_loss, masked_mean


@dataclasses.dataclass(frozen=True)
class Eagle3TrainConfig:
  draft_vocab_size: int | None = None  # None: the target's whole vocabulary
  aux_layer_ids: tuple[int, ...] | None = None  # None: EAGLE-3's (2, L//2, L-3)
  intermediate_size: int | None = None  # None: the target's
  norm_before_residual: bool = False
  chain: ChainTraining = ChainTraining(depth=7)  # DeepSpec's EAGLE-3 heads: ttt7


def vocab_size_for_coverage(train_tokens, heldout_tokens, coverage: float, vocab_size: int) -> int:
  """The fewest most-frequent training ids (ranked as `draft_vocab_from_tokens` ranks them) whose
  share of the held-out tokens reaches `coverage`: the draft vocabulary can then draft that share
  of what the target emits."""
  if not 0 < coverage <= 1:
    raise ValueError(f"draft_vocab_coverage={coverage}: must be in (0, 1]")
  counts = np.bincount(np.asarray(train_tokens).ravel(), minlength=vocab_size)[:vocab_size]
  order = np.lexsort((np.arange(vocab_size), -counts))
  held = np.bincount(np.asarray(heldout_tokens).ravel(), minlength=vocab_size)[:vocab_size]
  covered = np.cumsum(held[order]) / max(held.sum(), 1)
  return int(min(np.searchsorted(covered, coverage - 1e-12) + 1, vocab_size))


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
    out = forward(frozen["target"], tokens_BT, config, dtype, drafter.taps)
    ids_Vd = frozen["draft_ids"]
    in_vocab_V = jnp.zeros(config.vocab_size, bool).at[ids_Vd].set(True)
    weights = {
      "head": jax.tree.map(lambda p: p.astype(dtype), params),
      "embed": frozen["target"]["params"]["embed"]["embedding"],
      "draft_ids": ids_Vd,
    }

    def depth_term(out_D, teacher_V, valid):
      logits_Vd = drafter.draft_logits(weights, out_D)
      label = jnp.argmax(teacher_V, -1)
      p_Vd = jax.nn.softmax(teacher_V[..., ids_Vd])
      ce = -jnp.sum(p_Vd * jax.nn.log_softmax(logits_Vd), -1)
      agree = ids_Vd[jnp.argmax(logits_Vd, -1)] == label
      metrics = {
        "agree": masked_mean(agree, valid),  # over all positions: the draft's hit rate
        "in_vocab": masked_mean(in_vocab_V[label], valid),
      }
      return masked_mean(ce, valid & in_vocab_V[label]), metrics

    teacher_BTV = jax.lax.stop_gradient(out.logits)
    h_BTD = drafter.features(weights, out)
    return chain_loss(drafter, weights, h_BTD, tokens_BT, teacher_BTV, key, cfg.chain, depth_term)

  return loss_fn


def drafter(target_model, params, cfg: Eagle3TrainConfig, draft_ids) -> eagle3_lib.Eagle3:
  spec = head_config(target_model, cfg)
  return eagle3_lib.eagle3(target_model, params, config=spec, draft_ids=draft_ids)


def export(
  path: str, target_model, params, cfg: Eagle3TrainConfig, draft_ids, dtype=None,
  format: str = "legacy",
):  # fmt: skip
  """Writes a published EAGLE-3 layout that `eagle3.load_eagle3` reads back: "legacy" (EAGLE,
  SGLang, vLLM) or "speculators"."""
  d = drafter(target_model, params, cfg, draft_ids)
  eagle3_lib.save_eagle3(path, d, dtype, format=format)
