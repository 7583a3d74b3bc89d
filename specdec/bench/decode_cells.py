"""The decode benchmark's measurements: one function per cell, each returning the cell's figures
(the part adds the conditions). Timed in this process except where noted (`decode_child`).

Targets are random (`random_models`): speed does not depend on the values, and timings start from
a synthetic decode state, so no prefill runs. "Context" is the cache's slot count S: the model's
attention reads every slot and masks, so a step reads all S slots of every row whatever the rows'
lengths (they sit near the end of the cache). Bytes read per step = every weight as stored (scales
included; the embedding table counts only the B rows gathered) + the K and V caches
(2 L B S K H bytes x itemsize).
"""

import functools
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from specdec.bench import gpu_profile, timing
from specdec.bench.hlo_copies import hlo_copies
from specdec.bench.random_models import (
  fill,
  model_config,
  random_model,
  random_params,
  step_bytes,
  synthetic_state,
)
from specdec.decoding.generate import cache_slots, prompt_bucket
from specdec.decoding.memory import tree_bytes
from specdec.decoding.step import StepConfig, decode_chunk
from specdec.drafters import ngram, null
from specdec.model import Model
from specdec.models.config import ModelConfig
from specdec.models.fuse import fuse_projections
from specdec.ops.sampling import Sampling


def compile_aot(fn, *args, **static):
  """(compiled, seconds of lower + compile): the executable is called with the dynamic args only."""
  t = time.perf_counter()
  compiled = fn.lower(*args, **static).compile()
  return compiled, time.perf_counter() - t


def spread(per_s: list[float]) -> dict:
  """Median, min and max in microseconds, and the spread (max - min) / median."""
  med = statistics.median(per_s)
  return {
    "us": 1e6 * med,
    "us_min": 1e6 * min(per_s),
    "us_max": 1e6 * max(per_s),
    "spread": (max(per_s) - min(per_s)) / med,
    "reps": len(per_s),
  }


_copy = jax.jit(jnp.copy)  # not donated: XLA copies the array into a fresh output buffer


def copy_bandwidth(gib: float, n: int, reps: int) -> dict:
  """Device-to-device copy bandwidth, bytes read + written: per rep, n copies of a bf16 array
  enqueued back to back (dispatch overlaps the copies) and waited for once."""
  x = fill((int(gib * 2**29),), jnp.bfloat16, 0)
  y = jax.block_until_ready(_copy(x))  # compile and warm
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    for _ in range(n):
      y = _copy(x)  # the previous copy is freed once it is done
    jax.block_until_ready(y)
    times.append(time.perf_counter() - t)
  tbs = [2 * x.nbytes * n / t / 1e12 for t in times]
  return {"part": "copy", "gib": gib, "iters": n, "tb_s": statistics.median(tbs),
          "tb_s_min": min(tbs), "tb_s_max": max(tbs), "reps": reps}  # fmt: skip


def _null_step(config: ModelConfig, dtype) -> StepConfig:
  return StepConfig(config, dtype, null(), 0, Sampling(), "greedy", ())


def _decode_executable(model: Model, batch: int, slots: int, n_steps: int, reps: int):
  """(compiled chunk of n_steps one-token greedy steps, its warmed state, compile seconds); the
  state leaves room for `reps` more chunks."""
  sc = _null_step(model.config, model.dtype)
  start = slots - (reps + 1) * n_steps - 1
  st = synthetic_state(model.config, batch, slots, start, 0, model.kv_dtype or model.dtype)
  compiled, compile_s = compile_aot(decode_chunk, model.params, (), st, sc=sc, n_steps=n_steps)
  st = jax.block_until_ready(compiled(model.params, (), st))  # warm
  return compiled, st, compile_s


def decode_cell(model: Model, batch: int, slots: int, n_steps: int, reps: int) -> dict:
  """One-token greedy steps: `reps` chunks of n_steps, the state threaded (donated) through."""
  compiled, st, compile_s = _decode_executable(model, batch, slots, n_steps, reps)
  per_step = []
  for _ in range(reps):
    t = time.perf_counter()
    st = jax.block_until_ready(compiled(model.params, (), st))
    per_step.append((time.perf_counter() - t) / n_steps)
  nbytes = step_bytes(model.params, model.config, batch, slots, model.kv_dtype or model.dtype)
  med = statistics.median(per_step)
  total = nbytes["weight_bytes"] + nbytes["kv_bytes"]
  return {
    **spread(per_step),
    **nbytes,
    "tok_s": batch / med,
    "tb_s": total / med / 1e12,
    "n_steps": n_steps,
    "compile_s": compile_s,
  }


def profile_cell(
  model: Model, batch: int, slots: int, n_steps: int, reps: int, top: int, hlo_path: str
) -> dict:
  """The decode chunk's kernels over `reps` traced chunks (after a warm one), per step; the
  optimized HLO goes to `hlo_path` so each op stem can be looked up."""
  compiled, st, _ = _decode_executable(model, batch, slots, n_steps, reps)
  Path(hlo_path).write_text(compiled.as_text())
  state = [st]

  def call():
    state[0] = compiled(model.params, (), state[0])
    return state[0]

  t = time.perf_counter()
  kernels = gpu_profile.trace_kernels(call, reps)
  wall = time.perf_counter() - t
  return {
    **gpu_profile.summarize(kernels, reps * n_steps, top),
    "traced_step_us": 1e6 * wall / (reps * n_steps),  # tracing adds its own host overhead
    "n_steps": n_steps,
    "hlo_file": Path(hlo_path).name,
  }


def verify_cell(model: Model, slots: int, width: int, n: int, reps: int) -> dict:
  """A width-`width` target forward over the cache (B = 1), LM head included.

  timing.verify_loop does not donate the state, so each call also copies the cache into the loop's
  buffers once (the empty loop's fixed cost, docs/benchmarks.md), the same for every width.
  """
  sc = _null_step(model.config, model.dtype)
  st = synthetic_state(model.config, 1, slots, slots - width, 0, model.dtype)
  compiled, compile_s = compile_aot(timing.verify_loop, model.params, st, sc=sc, n=n, width=width)
  times = timing.timings(lambda: compiled(model.params, st), reps)
  return {**spread([t / n for t in times]), "iters": n, "compile_s": compile_s}


def loop_overhead(
  shape: dict, k: int, prompt_tokens: int, n_steps: int, reps: int, slope_n, hlo_path: str
) -> dict:
  """timing.time_step (k, ngram, B = 1) and the empty loop: its per-iteration cost as the slope of
  the loop's time between two trip counts (dispatch and one-off copies cancel), its fixed cost per
  call, and the copies in its optimized HLO (written to `hlo_path`)."""
  config = model_config(shape)
  model = random_model(config)
  parts = timing.time_step(model, ngram(), timing.Shape(1, k, prompt_tokens, n_steps, reps))
  slots = cache_slots(prompt_bucket(prompt_tokens), n_steps * (k + 1) + 1, k)
  st = synthetic_state(config, 1, slots, prompt_tokens, k, model.dtype)
  lo, hi = slope_n
  per_iter, fixed = timing.per_iteration(functools.partial(timing.empty_loop, st), lo, hi, reps)
  hlo = timing.empty_loop.lower(st, lo).compile().as_text()
  Path(hlo_path).write_text(hlo)
  return {
    **{f"{key}_us": 1e6 * v for key, v in parts.items() if key != "draft_per_token_vs_target"},
    "empty_loop_slope_us": 1e6 * per_iter,
    "empty_loop_fixed_us": 1e6 * fixed,
    "empty_loop_trip_counts": [lo, hi],
    "state_bytes": tree_bytes(st),
    "hlo_copies": hlo_copies(hlo),
    "hlo_file": Path(hlo_path).name,
  }


def compile_time(shape: dict, fmt: str, batch: int, slots: int, n_steps: int, cache_dir: str):
  """Lower + compile of the decode chunk from abstract inputs, with the persistent cache on (it
  sets JAX's cache options for the whole process: run it in a child)."""
  hits = []
  jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("cache_hits") else None
  )
  jax.config.update("jax_compilation_cache_dir", cache_dir)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  config = model_config(shape)
  dtype = jnp.dtype(jnp.bfloat16)
  params = jax.eval_shape(lambda: random_params(config, fmt, dtype))
  st = jax.eval_shape(lambda: synthetic_state(config, batch, slots, 1, 0, dtype))
  t0 = time.perf_counter()
  lowered = decode_chunk.lower(params, (), st, sc=_null_step(config, dtype), n_steps=n_steps)
  t1 = time.perf_counter()
  lowered.compile()
  t2 = time.perf_counter()
  return {"lower_s": t1 - t0, "compile_s": t2 - t1, "cache_hits": len(hits)}


def decode_child(
  shape: dict, fmt: str, batch: int, slots: int, n_steps: int, reps: int, fuse: bool
) -> dict:
  """decode_cell on a fresh random model (its projections fused if asked), for a process of its
  own (its own XLA_FLAGS)."""
  model = random_model(model_config(shape), fmt)
  return decode_cell(fuse_projections(model) if fuse else model, batch, slots, n_steps, reps)
