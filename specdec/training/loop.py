"""A generic optax training loop: one jitted step, progress bar, periodic eval, resumable state.

    params, history = fit(loss_fn, params, batches, optimizer=adamw(3e-4, steps=1000), steps=1000,
                          ckpt_dir="runs/x_ckpt", eval_fn=eval_fn, frozen=target.params)

`loss_fn(params, frozen, batch, key) -> (loss, metrics)` is traced once. `frozen` (a frozen
target's params, say) is an argument of the step, never a closure constant: a closed-over array
would be baked into the executable and copied for every compile.

Determinism: the step's key is fold_in(key(seed), step) and the data position is checkpointed with
params and optimizer state, so a run stopped (or killed) and resumed from its latest checkpoint
computes the same updates as one that never stopped.
"""

import math
import os
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from tqdm import tqdm

from specdec.progress import BAR_FORMAT, clock

LossFn = Callable[[Any, Any, Any, jax.Array], tuple[jax.Array, dict]]


def warmup_cosine(peak_lr: float, steps: int, warmup: int = 0, end_ratio: float = 0.1):
  """Linear warmup to peak_lr over `warmup` steps, then cosine to end_ratio * peak_lr at `steps`."""
  warmup = min(warmup, steps - 1)
  return optax.warmup_cosine_decay_schedule(
    # Starting at peak/warmup rather than 0 keeps step 0 from being a wasted no-op update.
    init_value=peak_lr / max(warmup, 1),
    peak_value=peak_lr,
    warmup_steps=warmup,
    decay_steps=steps,
    end_value=peak_lr * end_ratio,
  )


def adamw(
  lr: float = 3e-4,
  *,
  steps: int,
  warmup: int = 100,
  end_ratio: float = 0.1,
  weight_decay: float = 0.1,
  b1: float = 0.9,
  b2: float = 0.95,
  eps: float = 1e-8,
  clip: float = 1.0,
) -> optax.GradientTransformation:
  """AdamW on a warmup + cosine schedule with global-norm gradient clipping (the default).

  Weight decay skips vectors (norm scales, biases): decaying them only fights the normalization.
  """
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  return optax.chain(
    optax.clip_by_global_norm(clip),
    optax.adamw(
      warmup_cosine(lr, steps, warmup, end_ratio),
      b1=b1,
      b2=b2,
      eps=eps,
      weight_decay=weight_decay,
      mask=decay_mask,
    ),
  )


def _train_step(loss_fn, optimizer, params, opt_state, frozen, batch, base_key, step):
  key = jax.random.fold_in(base_key, step)
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  (loss, metrics), grads = grad_fn(params, frozen, batch, key)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  return params, opt_state, {**metrics, "loss": loss, "grad_norm": optax.tree.norm(grads)}


def count_tokens(batch) -> int:
  """Default tokens-per-batch for tokens/s: the size of the batch's largest array."""
  return max(int(np.size(x)) for x in jax.tree.leaves(batch))


def _floats(d: dict) -> dict:
  return {k: float(v) for k, v in d.items()}


def _manager(ckpt_dir: str, keep: int) -> ocp.CheckpointManager:
  # Synchronous saves: params are donated to the next step right after a save, and the zoo's
  # checkpoints are small enough that hiding the write buys nothing.
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False)
  return ocp.CheckpointManager(os.path.abspath(ckpt_dir), options=options)


def _save(mngr, step, params, opt_state, batches, history):
  meta = {"step": step, "history": history}
  if hasattr(batches, "get_state"):
    meta["data"] = batches.get_state()
  mngr.save(
    step,
    args=ocp.args.Composite(
      state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
      meta=ocp.args.JsonSave(meta),
    ),
    force=True,
  )


def _restore(mngr, step, params, opt_state, batches):
  state = {"params": params, "opt_state": opt_state}
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
  out = mngr.restore(
    step,
    args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
  )
  meta = out.meta
  if hasattr(batches, "set_state") and "data" in meta:
    batches.set_state(meta["data"])
  else:  # a stateless iterator: replay it (correct when it is deterministic)
    for _ in range(step):
      next(batches)
  return out.state["params"], out.state["opt_state"], meta["history"]


class _Meter:
  """Tokens/s over the steps since the last log, not counting compile, eval or checkpoint time."""

  def __init__(self):
    self.reset()

  def reset(self):
    self.t0, self.paused, self.tokens, self.steps = time.perf_counter(), 0.0, 0, 0

  def seconds(self) -> float:
    return max(time.perf_counter() - self.t0 - self.paused, 1e-9)

  def rate(self) -> float:
    return self.tokens / self.seconds()


def fit(
  loss_fn: LossFn,
  params,
  batches: Iterable,
  *,
  optimizer: optax.GradientTransformation | None = None,
  steps: int,
  ckpt_dir: str | None = None,
  ckpt_every: int = 1000,
  keep: int = 2,
  eval_fn: Callable[[Any], dict] | None = None,
  eval_every: int = 1000,
  on_eval: Callable[[Any, dict], None] | None = None,
  log_every: int = 50,
  seed: int = 0,
  frozen=None,
  tokens_of: Callable[[Any], int] = count_tokens,
  progress: bool = True,
  desc: str = "train",
) -> tuple[Any, dict]:
  """Runs `steps` optimizer steps of `loss_fn` (in total, counting steps done before a resume).

  params: the initial trainable pytree (float32 master weights); fit takes ownership: the buffers
    are donated to the first step, so keep no other reference to them.
  batches: an iterator; with get_state()/set_state(state) its position is checkpointed, otherwise
    a resume replays it from the start.
  optimizer: default adamw(3e-4, steps=steps).
  ckpt_dir: orbax checkpoints every `ckpt_every` steps and at the end; if it already holds one, the
    run resumes from the latest (params, optimizer state, data position, history).
  eval_fn(params) -> dict of scalars, every `eval_every` steps and at the end.
  on_eval(params, history): called after each eval (history["eval"][-1] is the new result, with its
    step); e.g. to export the best-so-far model. Donated params are only valid during the call.
  frozen: a pytree passed to every loss_fn call as an argument, not trained (a frozen teacher).

  Returns (params, history): history["train"] holds, every `log_every` steps, the mean of loss_fn's
  metrics since the last entry plus loss, grad_norm and tokens_per_s; history["eval"] holds
  eval_fn's results, each with its step.
  """
  optimizer = optimizer or adamw(3e-4, steps=steps)
  batches = iter(batches)
  opt_state = optimizer.init(params)
  history: dict = {"train": [], "eval": []}
  start = 0
  mngr = _manager(ckpt_dir, keep) if ckpt_dir else None
  if mngr is not None and mngr.latest_step() is not None:
    start = mngr.latest_step()
    params, opt_state, history = _restore(mngr, start, params, opt_state, batches)
    history.setdefault("resumed_at", []).append(start)

  step_fn = jax.jit(partial(_train_step, loss_fn, optimizer), donate_argnums=(0, 1))
  base_key = jax.random.key(seed)
  bar = tqdm(
    total=steps, initial=start, disable=not progress, dynamic_ncols=True, unit="steps",
    bar_format=BAR_FORMAT,
  )  # fmt: skip
  bar.set_description(desc)  # as the sweep's: "desc: n/total"
  meter, window, eval_s = _Meter(), [], []
  compiled = False
  try:
    for step in range(start, steps):
      batch = next(batches)
      n_tokens = tokens_of(batch)
      args = (frozen, batch, base_key, np.int32(step))
      params, opt_state, metrics = step_fn(params, opt_state, *args)
      window.append(metrics)
      bar.update(1)
      done = step + 1
      if not compiled:  # the first step compiles; keep that out of tokens/s
        jax.block_until_ready(metrics)
        history["compile_s"] = round(time.perf_counter() - meter.t0, 3)
        compiled = True
        meter.reset()
      else:
        meter.tokens += n_tokens
        meter.steps += 1
      if done % log_every == 0 or done == steps:
        means = {k: float(np.mean(v)) for k, v in jax.device_get(_stack(window)).items()}
        entry = {"step": done, **means, "tokens_per_s": round(meter.rate(), 1)}
        history["train"].append(entry)
        per_step = meter.seconds() / max(meter.steps, 1)
        evals = steps // eval_every - done // eval_every + (steps % eval_every != 0)
        evals_s = evals * float(np.mean(eval_s)) if eval_fn is not None and eval_s else 0.0
        bar.set_postfix_str(
          f"loss={means['loss']:.4f} tok/s={entry['tokens_per_s']:.3g} "
          f"ETA {clock((steps - done) * per_step + evals_s)} from measured steps and evals "
          f"(compile {history['compile_s']:.1f} s)"
        )
        window = []
        meter.reset()
      if eval_fn is not None and (done % eval_every == 0 or done == steps):
        t = time.perf_counter()
        result = {"step": done, **_floats(eval_fn(params))}
        history["eval"].append(result)
        bar.write(" ".join(f"{k}={_fmt(v)}" for k, v in result.items()))
        if on_eval is not None:
          on_eval(params, history)
        eval_s.append(time.perf_counter() - t)
        meter.paused += eval_s[-1]
      if mngr is not None and (done % ckpt_every == 0 or done == steps):
        t = time.perf_counter()
        _save(mngr, done, params, opt_state, batches, history)
        meter.paused += time.perf_counter() - t
  finally:
    bar.close()
    if mngr is not None:
      mngr.wait_until_finished()
      mngr.close()
  return params, history


def _stack(window: list[dict]) -> dict:
  return {k: [m[k] for m in window] for k in window[0]}


def _fmt(v) -> str:
  if isinstance(v, float) and not float(v).is_integer():
    return f"{v:.4g}" if math.isfinite(v) else str(v)
  return str(int(v)) if isinstance(v, float) else str(v)
