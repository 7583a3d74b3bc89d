"""Distilling a learned drafter (block / DFlash, MTP, EAGLE-3) against a frozen target.

Each method's module in specdec.training offers the same five functions:
  init_params(target, dcfg, key), frozen_params(target), make_loss(target, dcfg, **loss_kw),
  drafter(target, params, dcfg), export(path, target, params, dcfg)
and this driver adds what every method shares: the corpus windows, the optax loop with resumable
orbax checkpoints, a periodic held-out tau (greedy speculative decoding of held-out code with the
drafter as trained so far), and the export of the final drafter in its published layout.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

import specdec
from specdec.sweep import resolve_path
from specdec.training import data, loop


def method_module(name: str):
  from specdec.training import block

  modules = {"block": block}
  if name not in modules:
    raise ValueError(f"unknown drafter method {name!r}; choose one of {', '.join(modules)}")
  return modules[name]


def drafter_config(method: str, target, options: dict):
  if method == "block":
    from specdec.drafters.block_config import make_config

    return make_config(target.config, **options)
  raise ValueError(f"unknown drafter method {method!r}")


def heldout_prompts(tokens: np.ndarray, n: int, length: int) -> list[list[int]]:
  """n prompts of `length` tokens, evenly spread over the held-out split."""
  starts = np.linspace(0, len(tokens) - length - 1, n).astype(int)
  return [tokens[s : s + length].astype(int).tolist() for s in starts]


def make_tau_eval(target, module, dcfg, prompts, k: int, max_new_tokens: int):
  def eval_fn(params):
    d = module.drafter(target, jax.tree.map(np.asarray, params), dcfg)
    g = specdec.generate(target, prompts, max_new_tokens=max_new_tokens, drafter=d, k=k)
    return {"heldout_tau": g.stats["tau"], "heldout_acceptance": g.stats["acceptance_rate"]}

  return eval_fn


def train(cfg, corpus_dir: str, out: str, ckpt_dir: str | None = None):
  """Trains cfg.method against cfg.target on corpus_dir/train.npy; exports to `out`."""
  target = specdec.load(resolve_path(cfg.target), dtype=jnp.dtype(cfg.dtype))
  module = method_module(cfg.method)
  dcfg = drafter_config(cfg.method, target, dict(cfg.drafter))
  params = module.init_params(target, dcfg, jax.random.key(cfg.seed))
  loss_fn = module.make_loss(target, dcfg, **dict(cfg.loss))
  train_tokens = data.load_tokens(os.path.join(corpus_dir, "train.npy"), cfg.train_tokens)
  held = np.load(os.path.join(corpus_dir, "heldout.npy"))
  batches = data.TokenWindows(train_tokens, cfg.batch_size, cfg.seq_len, seed=cfg.seed)
  prompts = heldout_prompts(held, cfg.eval_prompts, cfg.eval_prompt_len)
  eval_fn = make_tau_eval(target, module, dcfg, prompts, cfg.eval_k, cfg.eval_new_tokens)
  opt = loop.adamw(cfg.lr, steps=cfg.steps, warmup=cfg.warmup, weight_decay=cfg.weight_decay)
  params, history = loop.fit(
    loss_fn, params, batches, optimizer=opt, steps=cfg.steps,
    ckpt_dir=ckpt_dir or out + "_ckpt", ckpt_every=cfg.ckpt_every, eval_fn=eval_fn,
    eval_every=cfg.eval_every, log_every=cfg.log_every, seed=cfg.seed,
    frozen=module.frozen_params(target), desc=os.path.basename(out.rstrip("/")),
  )  # fmt: skip
  module.export(out, target, jax.tree.map(np.asarray, params), dcfg)
  with open(os.path.join(out, "training.json"), "w") as f:
    json.dump({"config": cfg.to_dict(), "history": history, "device": jax.devices()[0].device_kind},
              f, indent=1, default=str)  # fmt: skip
  return history
