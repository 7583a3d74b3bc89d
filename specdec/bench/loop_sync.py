"""What a request's decode costs per step under four ways of running the loop, on a real pair.

Each request is one prefill and a decode to the budget, B = 1, timed on the host from the
prefill's end to the last chunk's `done` read; figures are wall us per useful step (decode wall /
the row's steps) and host round trips per request, over the requests after each leg's first.
  while   the library's `decode_chunk`: up to CHUNK_STEPS steps, stopped on the device once done
  cond    a fixed CHUNK_STEPS-trip loop whose body skips the step (`lax.cond`) once all are done
  mask    a fixed CHUNK_STEPS-trip loop running every step; done rows emit nothing
  host    the loop before issue 21: 16 or 1 steps, the host picking the size that cannot
          overshoot the budget (one round trip per step near the end of every request)
"""

import dataclasses
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec.decoding import generate as generate_lib
from specdec.decoding.generate import cache_slots, prompt_bucket
from specdec.decoding.step import StepConfig, decode_chunk, prefill, step
from specdec.ops.sampling import Sampling

VARIANTS = ("while", "cond", "mask", "host")


@functools.partial(jax.jit, static_argnames=("sc", "n", "skip"), donate_argnames=("st",))
def _fixed_chunk(params, draft_params, st, sc, n: int, skip: bool):
  def one(_, s):
    if not skip:
      return step(params, draft_params, s, sc)
    return jax.lax.cond(
      jnp.all(s.done), lambda s: s, lambda s: step(params, draft_params, s, sc), s
    )

  return jax.lax.fori_loop(0, n, one, st)


def _host_size(st, k: int) -> int:
  rem = np.asarray(st.max_new - (st.lengths - st.prompt_lengths))
  active = ~np.asarray(st.done)
  bound = int(np.max(-(-rem[active] // (k + 1)))) if active.any() else 1
  return 16 if bound >= 16 else 1


def _chunk(variant: str, params, dparams, st, sc, k: int):
  n = generate_lib.CHUNK_STEPS
  if variant == "while":
    return decode_chunk(params, dparams, st, sc, n)
  if variant == "host":
    return _fixed_chunk(params, dparams, st, sc, _host_size(st, k), False)
  return _fixed_chunk(params, dparams, st, sc, n, variant == "cond")


@dataclasses.dataclass(frozen=True)
class Request:
  decode_s: float
  steps: int
  host_syncs: int


def decode_one(variant: str, model, drafter, k: int, ids, max_new: int, bucket: int) -> Request:
  """One request: prefill, then chunks of `variant` until the row is done."""
  slots = cache_slots(bucket, max_new, k)
  sc = StepConfig(model.config, model.dtype, drafter, k, Sampling(), "greedy", (), None)
  prompt = np.zeros((1, bucket), np.int32)
  prompt[0, : len(ids)] = ids
  st = prefill(
    model.params, drafter.params, jnp.asarray(prompt), jnp.asarray([len(ids)], jnp.int32),
    jnp.asarray([max_new], jnp.int32), jax.random.key(0), sc, slots,
  )  # fmt: skip
  done, syncs = np.asarray(st.done), 1
  t0 = time.perf_counter()
  while not done.all():
    st = _chunk(variant, model.params, drafter.params, st, sc, k)
    done = np.asarray(st.done)
    syncs += 1 + (variant == "host")  # the host variant reads the budget before each chunk too
  return Request(time.perf_counter() - t0, int(st.steps[0]), syncs)


def run(model, drafters: dict, ks, prompts, max_news, legs: int, variants=VARIANTS) -> list[dict]:
  """Rows per (max_new, variant, arm, k), legs interleaved (every arm's leg 0, then leg 1)."""
  bucket = prompt_bucket(max(len(p) for p in prompts))
  arms = [("null", 0)] + [(name, k) for name in drafters if name != "null" for k in ks]
  rows = []
  for max_new in max_news:
    per: dict = {}
    for _ in range(legs):
      for variant in variants:
        for name, k in arms:
          reqs = [
            decode_one(variant, model, drafters[name], k, p, max_new, bucket) for p in prompts
          ][1:]  # each leg's first request compiles and warms
          per.setdefault((variant, name, k), []).append(reqs)
    for (variant, name, k), by_leg in per.items():
      us = [1e6 * sum(r.decode_s for r in rs) / sum(r.steps for r in rs) for rs in by_leg]
      flat = [r for rs in by_leg for r in rs]
      rows.append(
        dict(
          max_new=max_new, variant=variant, method=name, k=k, us_per_step=statistics.mean(us),
          us_per_step_legs=us, steps_per_request=statistics.mean(r.steps for r in flat),
          host_syncs_per_request=statistics.mean(r.host_syncs for r in flat),
          requests=len(flat),
        )
      )  # fmt: skip
  return rows


def to_markdown(rows: list[dict]) -> str:
  head = (
    "| max_new | loop | method | k | us / step (legs) | steps / request | host syncs / request |\n"
    "|---:|---|---|---:|---:|---:|---:|"
  )
  lines = [
    f"| {r['max_new']} | {r['variant']} | {r['method']} | {r['k']} | {r['us_per_step']:.1f} "
    f"({' / '.join(f'{u:.1f}' for u in r['us_per_step_legs'])}) | {r['steps_per_request']:.1f} "
    f"| {r['host_syncs_per_request']:.1f} |"
    for r in rows
  ]
  return "\n".join([head, *lines])
