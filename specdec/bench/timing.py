"""Timing of the step and its parts, each inside one jitted on-device loop.

Every figure is a slope: (time of a loop of 2n iterations - time of a loop of n) / n, medians over
repetitions. Whatever a call pays once cancels: host dispatch, the copy of a state the timing loop
does not donate, the prefill that builds the step's fresh state.
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
from specdec.decoding.step import StepConfig, decode_chunk, prefill
from specdec.drafters.base import Context
from specdec.ops.sampling import Sampling


@dataclasses.dataclass(frozen=True)
class Shape:
  batch: int = 1
  k: int = 4
  prompt_tokens: int = 64
  n_steps: int = 32
  reps: int = 5


def timings(fn, reps: int) -> list[float]:
  """Wall seconds of `reps` calls of fn, each waited for, after one call that compiles and warms."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return times


def per_iteration(run, lo: int, hi: int, reps: int) -> tuple[float, float]:
  """(seconds per iteration, seconds paid once per call) of run(n), an n-iteration loop, from the
  medians at n = lo and n = hi."""
  t_lo, t_hi = (statistics.median(timings(functools.partial(run, n), reps)) for n in (lo, hi))
  slope = (t_hi - t_lo) / (hi - lo)
  return slope, t_lo - lo * slope


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
def verify_loop(params, st, sc, n, width):
  positions_BK1 = st.lengths[:, None] - 1 + jnp.arange(width, dtype=jnp.int32)
  tokens_BK1 = jnp.take_along_axis(st.tokens, positions_BK1, 1)

  def body(i, carry):
    cache, acc = carry
    out = sc.module.apply(params, tokens_BK1, positions_BK1, cache, taps=sc.drafter.taps)
    return out.cache, acc + jnp.argmax(out.logits, -1).sum()  # keeps the LM head in the loop

  return jax.lax.fori_loop(0, n, body, (st.cache, jnp.int32(0)))


@functools.partial(jax.jit, static_argnames=("n",))
def empty_loop(st, n):
  return jax.lax.fori_loop(0, n, lambda i, s: s.replace(steps=s.steps + 1), st)


def time_step(model, drafter, shape: Shape, sampling=None, mode=None) -> dict:
  """Seconds per iteration of the step and of its parts, for one static shape."""
  sampling = sampling or Sampling()
  mode = mode or ("greedy" if sampling.greedy else "onehot")
  B, k, n = shape.batch, shape.k, shape.n_steps
  bucket = prompt_bucket(shape.prompt_tokens)
  max_new = 2 * n * (k + 1) + 1  # room for the longer of the two timed loops
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
  runs = {
    # decode_chunk donates its state, so every call starts from a fresh prefill (it cancels).
    "step": lambda m: decode_chunk(model.params, drafter.params, fresh(), sc, m),
    "draft": lambda m: _draft_loop(drafter.params, st, sc, m),
    "verify": lambda m: verify_loop(model.params, st, sc, m, k + 1),
    "target_fwd": lambda m: verify_loop(model.params, st, sc, m, 1),
    "loop": lambda m: empty_loop(st, m),
  }
  per = {key: per_iteration(run, n, 2 * n, shape.reps)[0] for key, run in runs.items()}
  per["accept_commit"] = per["step"] - per["draft"] - per["verify"] - per["loop"]
  # What decides the draft-budget knee: a drafted token's cost in target forwards.
  per["draft_per_token_vs_target"] = per["draft"] / (k * per["target_fwd"])
  return per
