"""Distilling a learned drafter (block / DFlash, MTP, EAGLE-3) against a frozen target.

Each method's module in specdec.training offers init_params, frozen_params, make_loss, drafter and
export; `build_method` binds them to a configuration. This driver adds what every method shares:
the corpus windows, the optax loop with resumable orbax checkpoints, a periodic held-out tau
(greedy speculative decoding of held-out code with the drafter as trained so far), and the export
of the final drafter in its published layout.
"""

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec.checkpoint.loader import load
from specdec.checkpoint.zoo import resolve_path
from specdec.decoding.generate import generate
from specdec.ops.attention import attention_path
from specdec.training import data, loop


@dataclasses.dataclass(frozen=True)
class Method:
  """One learned drafter kind, its configuration bound: what the driver calls."""

  init: Callable  # key -> params
  frozen: Any
  loss: Callable  # loss_fn(params, frozen, batch, key)
  drafter: Callable  # params -> Drafter
  export: Callable  # (path, params) -> None


def build_method(cfg, target, train_tokens, heldout_tokens=None) -> Method:
  """cfg.method in {block, mtp, eagle3} with cfg.drafter options and cfg.loss keywords (EAGLE-3's
  `draft_vocab_coverage` sizes its draft vocabulary on `heldout_tokens`); cfg.export_format, if
  set, is the layout block and EAGLE-3 drafters are written in ("speculators": vLLM's)."""
  opts, loss_kw = dict(cfg.drafter), dict(cfg.loss)
  fmt = {"format": cfg.export_format} if cfg.get("export_format") else {}
  if cfg.method == "block":
    from specdec.drafters.block_config import make_config
    from specdec.training import block as m

    d = make_config(target.config, **opts)
    return Method(
      lambda key: m.init_params(target, d, key), m.frozen_params(target),
      m.make_loss(target, d, **loss_kw), lambda p: m.drafter(target, p, d),
      lambda path, p: m.export(path, target, p, d, **fmt),
    )  # fmt: skip
  if cfg.method == "mtp":
    from specdec.training import mtp as m

    d = m.MTPTrainConfig(chain=m.ChainTraining(**opts.get("chain", {})))
    return Method(
      lambda key: m.init_params(target, d, key), m.frozen_params(target),
      m.make_loss(target, d), lambda p: m.drafter(target, p, d),
      lambda path, p: m.export(path, target, p, d),
    )  # fmt: skip
  if cfg.method == "eagle3":
    from specdec.drafters.eagle3 import draft_vocab_from_tokens
    from specdec.training import eagle3 as m
    from specdec.training.mtp import ChainTraining

    V = target.config.vocab_size
    size = opts.get("draft_vocab_size") or V
    if opts.get("draft_vocab_coverage"):
      if heldout_tokens is None:
        raise ValueError("drafter.draft_vocab_coverage needs held-out tokens to measure it on")
      cover = opts["draft_vocab_coverage"]
      size = m.vocab_size_for_coverage(train_tokens, heldout_tokens, cover, V)
    ids = draft_vocab_from_tokens(train_tokens, size, target.config.vocab_size)
    d = m.Eagle3TrainConfig(
      draft_vocab_size=size, aux_layer_ids=tuple(opts.get("aux_layer_ids") or ()) or None,
      chain=ChainTraining(**opts.get("chain", {})),
    )  # fmt: skip
    return Method(
      lambda key: m.init_params(target, d, key), m.frozen_params(target, ids),
      m.make_loss(target, d), lambda p: m.drafter(target, p, d, ids),
      lambda path, p: m.export(path, target, p, d, ids, **fmt),
    )  # fmt: skip
  raise ValueError(f"unknown drafter method {cfg.method!r}; choose one of block, mtp, eagle3")


def heldout_prompts(tokens: np.ndarray, n: int, length: int) -> list[list[int]]:
  """n prompts of `length` tokens, evenly spread over the held-out split."""
  starts = np.linspace(0, len(tokens) - length - 1, n).astype(int)
  return [tokens[s : s + length].astype(int).tolist() for s in starts]


def make_tau_eval(target, method: Method, prompts, k: int, max_new_tokens: int):
  def eval_fn(params):
    d = method.drafter(jax.tree.map(np.asarray, params))
    g = generate(target, prompts, max_new_tokens=max_new_tokens, drafter=d, k=k)
    return {"heldout_tau": g.stats["tau"], "heldout_acceptance": g.stats["acceptance_rate"]}

  return eval_fn


def train(cfg, corpus_dir: str, out: str, ckpt_dir: str | None = None):
  """Trains cfg.method against cfg.target on corpus_dir/train.npy; exports to `out`."""
  target = load(resolve_path(cfg.target), dtype=jnp.dtype(cfg.dtype))
  train_file = os.path.join(corpus_dir, cfg.get("train_file", "train.npy"))
  train_tokens = data.load_tokens(train_file, cfg.train_tokens)
  held = np.load(os.path.join(corpus_dir, "heldout.npy"))
  method = build_method(cfg, target, train_tokens, held)
  params = method.init(jax.random.key(cfg.seed))
  batches = data.TokenWindows(train_tokens, cfg.batch_size, cfg.seq_len, seed=cfg.seed)
  prompts = heldout_prompts(held, cfg.eval_prompts, cfg.eval_prompt_len)
  eval_fn = make_tau_eval(target, method, prompts, cfg.eval_k, cfg.eval_new_tokens)
  opt = loop.adamw(cfg.lr, steps=cfg.steps, warmup=cfg.warmup, weight_decay=cfg.weight_decay)
  params, history = loop.fit(
    method.loss, params, batches, optimizer=opt, steps=cfg.steps,
    ckpt_dir=ckpt_dir or out + "_ckpt", ckpt_every=cfg.ckpt_every, eval_fn=eval_fn,
    eval_every=cfg.eval_every, log_every=cfg.log_every, seed=cfg.seed,
    frozen=method.frozen, desc=os.path.basename(out.rstrip("/")),
  )  # fmt: skip
  method.export(out, jax.tree.map(np.asarray, params))
  with open(os.path.join(out, "training.json"), "w") as f:
    record = {"config": cfg.to_dict(), "train_file": train_file, "history": history}
    record |= {"device": jax.local_devices()[0].device_kind, "attention": attention_path()}
    json.dump(record, f, indent=1, default=str)
  return history
