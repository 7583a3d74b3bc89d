"""The XLA flags specdec runs with unless XLA_FLAGS already names them.

`--xla_gpu_graph_enable_concurrent_region=true` lets the CUDA graphs XLA builds for a decode step
run kernels that do not depend on each other side by side (XLA decides which); it changes no value,
only the launch order. Measured gain: docs/benchmarks.md, "XLA launch flags".

XLA parses XLA_FLAGS once, when JAX starts its first backend, so the entry points (every
`experiments/*` main that runs JAX) call `apply_defaults` first; importing specdec changes nothing.
A library user who wants the defaults calls it before any JAX work. Set XLA_FLAGS to name a flag
(`...=false`) to run without it. Kernel benchmarks turn the regions off (`serialize_graphs`).

`enable_compile_cache` turns on JAX's persistent compilation cache in a user cache directory
(`specdec.load` and `specdec.generate` call it): a second process loads the executables the first
built. SPECDEC_COMPILE_CACHE=off turns it off; a directory set in jax's own config wins. On the
CPU backend it stays off unless SPECDEC_COMPILE_CACHE names a directory: loading a CPU executable
from the cache has crashed processes (a segfault inside jax's `get_executable_and_time`).
"""

import os
import warnings
from pathlib import Path

CONCURRENT_REGION = "--xla_gpu_graph_enable_concurrent_region"
DEFAULT_FLAGS = (f"{CONCURRENT_REGION}=true",)


def flag_name(flag: str) -> str:
  return flag.split("=", 1)[0].lstrip("-")


def with_defaults(xla_flags: str) -> str:
  """`xla_flags` plus each default flag whose name it does not already set."""
  named = {flag_name(f) for f in xla_flags.split()}
  extra = [f for f in DEFAULT_FLAGS if flag_name(f) not in named]
  return " ".join([*xla_flags.split(), *extra])


def _backend_started() -> bool:
  from jax._src import xla_bridge  # no public way to ask whether a backend has started

  return xla_bridge.backends_are_initialized()


def apply_defaults() -> None:
  """Puts the defaults into os.environ["XLA_FLAGS"] (for this process and its children)."""
  flags = with_defaults(os.environ.get("XLA_FLAGS", ""))
  if flags == os.environ.get("XLA_FLAGS", ""):
    return
  if _backend_started():
    warnings.warn(
      f"specdec was imported after JAX started a backend: its XLA flags {DEFAULT_FLAGS} do not "
      "apply in this process (import specdec first, or set XLA_FLAGS yourself)",
      stacklevel=3,
    )
    return
  os.environ["XLA_FLAGS"] = flags


def serialize_graphs() -> None:
  """Turns concurrent regions off for this process (before JAX starts a backend). Kernel
  benchmarks need it: they sum CUPTI kernel times over a chain of independent calls, which
  concurrent regions run side by side, so each call's time counts the others' (docs/benchmarks.md
  has the probe runs that read XLA's dot that way)."""
  name = flag_name(CONCURRENT_REGION)
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if flag_name(f) != name]
  off = " ".join([*flags, f"{CONCURRENT_REGION}=false"])
  if off == os.environ.get("XLA_FLAGS"):
    return
  if _backend_started():
    raise RuntimeError(
      "a kernel benchmark needs XLA_FLAGS without concurrent CUDA-graph regions, but JAX has "
      f"already started a backend: run it in a fresh process, or set {CONCURRENT_REGION}=false "
      "in XLA_FLAGS first"
    )
  os.environ["XLA_FLAGS"] = off


COMPILE_CACHE_ENV = "SPECDEC_COMPILE_CACHE"  # "off" (or "0"): no cache; a path: the cache there


def default_cache_dir() -> Path:
  """$XDG_CACHE_HOME/specdec/jax, or ~/.cache/specdec/jax."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return Path(base) / "specdec" / "jax"


def enable_compile_cache() -> str | None:
  """Points jax's persistent compilation cache at specdec's user cache directory unless the user
  chose otherwise (on the CPU backend, only at a directory SPECDEC_COMPILE_CACHE names); returns
  the directory in use (None: no cache). Only takes effect before the process's first compile
  (jax reads the setting once)."""
  import jax

  chosen = os.environ.get(COMPILE_CACHE_ENV, "")
  if chosen.lower() in ("off", "0", "false", "no"):
    return None
  current = jax.config.jax_compilation_cache_dir
  if current:
    return current
  if not chosen and jax.default_backend() == "cpu":
    return None
  path = Path(chosen) if chosen else default_cache_dir()
  path.mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", str(path))
  # Every executable, however quick to build (jax's default keeps only those over 1 s): a second
  # run of a sweep then compiles nothing.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  return str(path)
