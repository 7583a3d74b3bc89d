"""The cost curve t_step that k="auto" and tree="auto" divide by: measured once, cached on disk.

`measure` times the compiled decode chunk at each tier (a chain's k or a tree, each its own step) on
whatever backend is present: a prefilled batch at a given context and cache size, `n_steps` steps in
one on-device loop per call, every draft rejected (so each call does the same work at the same
context; the batch is prefilled once and each call runs on a copy of that state), a first round
over the tiers (compile and warm-up) discarded, then `reps` rounds with the tiers interleaved; the
median of each tier's calls divided by n_steps. Acceptance runs greedy.
Under a mesh it times the sharded step `generate` runs there (the target's params and the state
placed as `generate` places them, the chunk under the mesh).
`cost_curve` keys the result by everything that changes it (target config, drafter, device kind,
mesh shape, batch, dtypes, tiers, slots, context) and keeps it as a JSON file under the user cache
directory, so the next decode of those conditions loads it.
"""

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specdec import sharding, xla_env
from specdec.decoding.budget import Budget, tier_configs
from specdec.decoding.step import StepConfig, decode_chunk, prefill_fields, with_counters
from specdec.ops.sampling import Sampling

COST_CACHE_ENV = "SPECDEC_STEP_COSTS"  # a directory: the cost curves there (default: user cache)


def default_dir() -> Path:
  return Path(os.environ.get(COST_CACHE_ENV) or xla_env.default_cache_dir().parent / "step_costs")


def _describe(drafter) -> dict:
  """The drafter's identity for the cache key: its name and fields, a model by its config."""
  out = {"name": drafter.name}
  for f in dataclasses.fields(drafter):
    v = getattr(drafter, f.name)
    if isinstance(v, (int, float, str, bool, tuple, type(None))):
      out[f.name] = repr(v)
    elif hasattr(v, "config"):
      out[f.name] = repr(v.config)
    else:
      out[f.name] = type(v).__name__
  return out


def cache_key(
  model, drafter, budget: Budget, batch: int, slots: int, context: int, kv_dtype, mesh=None
):
  device = jax.devices()[0]
  return {
    "target": repr(model.config),
    "drafter": _describe(drafter),
    "backend": device.platform,
    "device_kind": device.device_kind,
    "mesh": None if mesh is None else dict(mesh.shape),
    "batch": batch,
    "dtype": jnp.dtype(model.dtype).name,
    "kv_dtype": jnp.dtype(kv_dtype or model.dtype).name,
    "tiers": budget.spec(),
    "slots": slots,
    "context": context,
  }


def measure(
  model, drafter, budget: Budget, batch: int, slots: int, context: int, n_steps: int = 16,
  reps: int = 7, kv_dtype=None, mesh=None,
) -> np.ndarray:  # fmt: skip
  """Seconds per step at each tier of `budget` ([N]) for `batch` rows in caches of `slots` slots
  whose context holds `context` tokens (fewer steps than n_steps where the slots run out); under
  `mesh` (a `sharding.make_mesh` mesh), of the step partitioned over it."""
  budget.validate()
  width = max(budget.sizes)  # the slots the largest tier's verify writes after the newest token
  n_steps = min(n_steps, slots - context - width - 2)
  if batch < 1 or context < 1 or n_steps < 1 or reps < 1:
    raise ValueError(
      f"measure needs batch, context, reps >= 1 and room for a step after the context in the "
      f"slots, got batch={batch}, context={context}, reps={reps}, slots={slots} at "
      f"{budget.label(-1)}"
    )
  rng = np.random.default_rng(0)
  bucket = 1 << (context - 1).bit_length()  # the prefill's bucket only shapes the first call
  if bucket > slots:
    raise ValueError(f"measure: the {context}-token context pads to {bucket} > slots={slots}")
  prompt_BT = np.zeros((batch, bucket), np.int32)
  prompt_BT[:, :context] = rng.integers(0, model.config.vocab_size, (batch, context))
  lengths_B = jnp.full((batch,), context, jnp.int32)
  max_new_B = jnp.full((batch,), n_steps + 2, jnp.int32)  # no row finishes inside a chunk
  if mesh is not None:  # as `generate` runs under a mesh: inputs replicated, params placed
    model = sharding.on_mesh(model, mesh)
    lengths_B, max_new_B = jax.device_put((lengths_B, max_new_B), sharding.replicated(mesh))

  def timed(sc: StepConfig, label: str) -> float:
    # A copy of the one prefilled state: a prefill of the batch can cost more than the chunk.
    st = with_counters(jax.tree.map(jnp.copy, fields), sc, reject=True)
    if mesh is not None:
      st = jax.device_put(st, sharding.decode_state_shardings(st, mesh))
    jax.block_until_ready(st)
    t0 = time.perf_counter()
    st = jax.block_until_ready(decode_chunk(model.params, drafter.params, st, sc, n_steps))
    dt = time.perf_counter() - t0
    if int(np.asarray(st.steps).min()) != n_steps:
      raise RuntimeError(f"measure: the {label} chunk stopped before {n_steps} steps")
    return dt

  with jax.set_mesh(mesh) if mesh else contextlib.nullcontext():
    base = StepConfig(model.config, model.dtype, drafter, 0, Sampling(), "greedy", (), kv_dtype)
    fields = prefill_fields(
      model.params, drafter.params, jnp.asarray(prompt_BT), lengths_B, max_new_B,
      jax.random.key(0), base.for_prefill, slots,
    )  # fmt: skip
    tiers = list(enumerate(tier_configs(base, budget)))
    for i, sc in tiers:  # compile and warm up every tier first: this round is discarded
      timed(sc, budget.label(i))
    # Tiers interleaved within each round, so drift over the rounds (clocks, heat) lands on
    # every tier alike instead of on whichever was timed first.
    times_RN = [[timed(sc, budget.label(i)) for i, sc in tiers] for _ in range(reps)]
  return np.median(np.asarray(times_RN), 0) / n_steps


def cost_curve(
  model, drafter, budget: Budget, batch: int, slots: int, context: int, kv_dtype=None,
  cache_dir: Path | None = None, mesh=None, **measure_kw,
) -> np.ndarray:  # fmt: skip
  """The cached cost curve for these conditions ([N] float32 seconds per step), measured (and
  written) when there is none; `mesh`: the step partitioned over it, a curve of its own."""
  key = cache_key(model, drafter, budget, batch, slots, context, kv_dtype, mesh)
  name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
  path = Path(cache_dir or default_dir()) / f"{name}.json"
  if path.exists():
    saved = json.loads(path.read_text())
    if saved.get("key") == key:
      return budget.check_costs(saved["seconds"])
  seconds = measure(
    model, drafter, budget, batch, slots, context, kv_dtype=kv_dtype, mesh=mesh, **measure_kw
  )
  seconds = budget.check_costs(seconds)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(f".{os.getpid()}.tmp")
  tmp.write_text(json.dumps({"key": key, "seconds": seconds.tolist()}, indent=1))
  tmp.replace(path)
  return seconds
