"""Timing of the step and its parts, each inside one jitted on-device loop.

Every figure is the median over repetitions of (wall time of a loop of n iterations) / n, so host
dispatch (~60 us on a GPU) is spread over n and the per-iteration cost is what remains:
  step           decode_chunk: the whole draft -> verify -> accept -> commit
  draft          the drafter's propose alone
  verify         the target forward over k+1 positions alone
  target_fwd     the target forward over one position (a plain decode step's forward)
  loop           a loop whose body only threads the state through (the loop's own overhead)
  accept_commit  step - draft - verify - loop (what the step adds around its two forwards)
"""

import dataclasses
import functools
import statistics
import time

import jax
import jax.numpy as jnp

from specdec.decoding.generate import cache_slots, prompt_bucket
from specdec.decoding.sampling import Sampling
from specdec.decoding.step import StepConfig, decode_chunk, prefill
from specdec.drafters.base import Context


@dataclasses.dataclass(frozen=True)
class Shape:
  batch: int = 1
  k: int = 4
  prompt_tokens: int = 64
  n_steps: int = 32
  reps: int = 5


def _median_time(fn, reps: int) -> float:
  jax.block_until_ready(fn())  # compile and warm
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return statistics.median(times)


@functools.partial(jax.jit, static_argnames=("sc", "n"))
def _draft_loop(dparams, st, sc, n):
  ctx = Context(st.tokens, st.lengths)

  def body(i, carry):
    d, key, acc = carry
    key, sub = jax.random.split(key)
    draft_BK, _, d = sc.drafter.propose(dparams, d, ctx, sc.k, sc.draft_sampling, sub)
    return d, key, acc + draft_BK.sum()  # consumed, so XLA cannot drop the drafting

  return jax.lax.fori_loop(0, n, body, (st.draft, st.key, jnp.int32(0)))


@functools.partial(jax.jit, static_argnames=("sc", "n", "width"))
def _verify_loop(params, st, sc, n, width):
  positions_BK1 = st.lengths[:, None] - 1 + jnp.arange(width, dtype=jnp.int32)
  tokens_BK1 = jnp.take_along_axis(st.tokens, positions_BK1, 1)

  def body(i, carry):
    cache, acc = carry
    out = sc.module.apply(params, tokens_BK1, positions_BK1, cache, taps=sc.drafter.taps)
    return out.cache, acc + jnp.argmax(out.logits, -1).sum()  # keeps the LM head in the loop

  return jax.lax.fori_loop(0, n, body, (st.cache, jnp.int32(0)))


@functools.partial(jax.jit, static_argnames=("n",))
def _empty_loop(st, n):
  return jax.lax.fori_loop(0, n, lambda i, s: s.replace(steps=s.steps + 1), st)


def time_step(model, drafter, shape: Shape, sampling=None, mode=None) -> dict:
  """Seconds per iteration of the step and of its parts, for one static shape."""
  sampling = sampling or Sampling()
  mode = mode or ("greedy" if sampling.greedy else "onehot")
  B, k, n = shape.batch, shape.k, shape.n_steps
  bucket = prompt_bucket(shape.prompt_tokens)
  max_new = n * (k + 1) + 1
  slots = cache_slots(bucket, max_new, k)
  eos = ()  # rows never finish early: every iteration does full work
  sc = StepConfig(model.config, model.dtype, drafter, k, sampling, mode, eos)
  prompt = jax.random.randint(jax.random.key(1), (B, bucket), 1, model.config.vocab_size)
  lengths = jnp.full((B,), shape.prompt_tokens, jnp.int32)

  def fresh():
    return prefill(
      model.params, drafter.params, prompt, lengths, jnp.full((B,), max_new, jnp.int32),
      jax.random.key(0), sc, slots,
    )  # fmt: skip

  st = fresh()
  out = {
    "step": _median_time(
      lambda: decode_chunk(model.params, drafter.params, fresh(), sc, n), shape.reps
    ),
    "prefill_only": _median_time(fresh, shape.reps),
    "draft": _median_time(lambda: _draft_loop(drafter.params, st, sc, n), shape.reps),
    "verify": _median_time(lambda: _verify_loop(model.params, st, sc, n, k + 1), shape.reps),
    "target_fwd": _median_time(lambda: _verify_loop(model.params, st, sc, n, 1), shape.reps),
    "loop": _median_time(lambda: _empty_loop(st, n), shape.reps),
  }
  # decode_chunk's figure includes a prefill: its state is donated, so each rep needs a fresh one.
  per = {key: v / n for key, v in out.items() if key != "prefill_only"}
  per["step"] = (out["step"] - out["prefill_only"]) / n
  per["accept_commit"] = per["step"] - per["draft"] - per["verify"] - per["loop"]
  # What decides the draft-budget knee: a drafted token's cost in target forwards.
  per["draft_per_token_vs_target"] = per["draft"] / (k * per["target_fwd"])
  return per
