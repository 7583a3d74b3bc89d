"""What the kernels' benchmark and GPU-check functions share: the device timer, the error measure,
the check cases, the tuning-config sweep.

`call_times_us` sums CUPTI kernel time over a chain of independent calls, so the process must run
with concurrent CUDA-graph regions off: experiments/bench_kernel.py, the entry point of every
kernel benchmark, turns them off (specdec.xla_env.serialize_graphs) before JAX starts a backend.
How the figures in docs/benchmarks.md were taken: its "Kernel notes moved from the code".
"""

import itertools
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def rel_err(y, ref) -> float:
  y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
  return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def call_times_us(fn, args, calls: int, iterations: int) -> list[float]:
  """Device time per call: CUPTI's summed kernel time per run / calls; wall clock without CUPTI."""
  from jax.experimental.mosaic.gpu import profiler

  try:
    _, runs = profiler.measure(fn, iterations=iterations)(*args)
    return [1e3 * t / calls for t in (runs if isinstance(runs, list) else [runs])]
  except Exception as e:  # noqa: BLE001 -- CUPTI may be unavailable; fall back to wall clock
    print(f"  CUPTI unavailable ({type(e).__name__}: {e}); using wall clock", file=sys.stderr)
  jax.block_until_ready(fn(*args))
  t0 = time.perf_counter()
  for _ in range(iterations):
    jax.block_until_ready(fn(*args))
  return [1e6 * (time.perf_counter() - t0) / iterations / calls]


def median_us(fn, args, calls: int, iterations: int) -> float:
  return statistics.median(call_times_us(fn, args, calls, iterations))


def dense_weights(k: int, n: int, copies: int) -> list[jax.Array]:
  """`copies` random bf16 (K, N) weights: XLA's bf16 dot on them is every GEMV's baseline."""
  dense = jax.random.normal(jax.random.key(1), (copies, k, n), jnp.bfloat16)
  return [dense[c] for c in range(copies)]


def dot_us(x, dense_list, iterations: int) -> float:
  """XLA's bf16 dot of x with one dense weight, per call over the copies in `dense_list`."""
  fn = jax.jit(lambda x, ds: [jnp.dot(x, d) for d in ds])
  return median_us(fn, (x, dense_list), len(dense_list), iterations)


def time_kernel(label: str, matmul, x, ws, ref, iterations: int) -> dict:
  """compile_s of matmul(x, ws[0]), its rel_err against `ref`, and us: its time per call over the
  weight copies `ws`. A failure to compile or run is printed and returned as `error`, so that a
  sweep goes on."""
  try:
    t0 = time.perf_counter()
    compiled = jax.jit(matmul).lower(x, ws[0]).compile()
    row = {"compile_s": time.perf_counter() - t0, "rel_err": rel_err(compiled(x, ws[0]), ref)}
    chain = jax.jit(lambda x, ws: [matmul(x, w) for w in ws])
    return row | {"us": median_us(chain, (x, ws), len(ws), iterations)}
  except Exception as e:  # noqa: BLE001 -- report the failure in the table and keep going
    error = f"{type(e).__name__}: {str(e)[:2000]}"
    print(f"FAILED {label}: {error}", file=sys.stderr)
    return {"error": error}


def check_case(name: str, measure) -> bool:
  """One GPU check: measure() -> (passed, message). A failure to compile or run prints the
  compiler's message and fails the case, so the remaining cases still run."""
  try:
    passed, message = measure()
  except Exception as e:  # noqa: BLE001 -- print the compiler's message and go on
    passed, message = False, f"FAILED {type(e).__name__}: {str(e)[:3000]}"
  print(f"{name}: {message}", flush=True)
  return passed


def check_against(matmul, ref, x_MK, w, config, bound: float = 1e-2) -> tuple[bool, str]:
  """The kernel entry `matmul(x, w, config=...)` against `ref` on one case, for `check_case`."""
  err = rel_err(matmul(x_MK, w, config=config), ref(x_MK, w))
  return err < bound, f"rel_err {err:.2e}"


def config_sweep(config_cls, first, *rest) -> list:
  """config_cls(*values) for every combination of the axes' values; none when the first axis
  (the tile width) is empty: the kernel's heuristic config then."""
  return [config_cls(*values) for values in itertools.product(first, *rest)] if first else []
