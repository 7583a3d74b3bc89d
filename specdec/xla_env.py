"""The XLA flags specdec runs with unless XLA_FLAGS already names them.

`--xla_gpu_graph_enable_concurrent_region=true` lets the CUDA graphs XLA builds for a decode step
run independent kernels (the K and V cache writes, the q and k norms) side by side. Measured on
the H200 (docs/benchmarks.md, session 7): the Qwen3-8B-shape bf16 step at B = 1, 1k went from
4805.8 / 4723.0 / 4758.2 to 4619.3 / 4659.0 / 4653.5 us (three interleaved legs), NVFP4 from
2984.5 to 2934.4 us. It changes no value, only the launch order.

XLA parses XLA_FLAGS once, when JAX starts its first backend, so `apply_defaults` runs when
specdec is imported; a process that used JAX before that keeps the flags it started with (and
is warned). Set XLA_FLAGS to name a flag (`...=false`) to run without it.
"""

import os
import warnings

DEFAULT_FLAGS = ("--xla_gpu_graph_enable_concurrent_region=true",)


def flag_name(flag: str) -> str:
  return flag.split("=", 1)[0].lstrip("-")


def with_defaults(xla_flags: str) -> str:
  """`xla_flags` plus each default flag whose name it does not already set."""
  named = {flag_name(f) for f in xla_flags.split()}
  extra = [f for f in DEFAULT_FLAGS if flag_name(f) not in named]
  return " ".join([*xla_flags.split(), *extra])


def apply_defaults() -> None:
  """Puts the defaults into os.environ["XLA_FLAGS"] (for this process and its children)."""
  flags = with_defaults(os.environ.get("XLA_FLAGS", ""))
  if flags == os.environ.get("XLA_FLAGS", ""):
    return
  from jax._src import xla_bridge  # no public way to ask whether a backend has started

  if xla_bridge.backends_are_initialized():
    warnings.warn(
      f"specdec was imported after JAX started a backend: its XLA flags {DEFAULT_FLAGS} do not "
      "apply in this process (import specdec first, or set XLA_FLAGS yourself)",
      stacklevel=3,
    )
    return
  os.environ["XLA_FLAGS"] = flags
