"""Where a jitted call's device time goes: kernel durations from a JAX profiler trace.

A decode step that runs below the HBM roofline loses the rest either inside kernels (a GEMM
below bandwidth) or between them (launch gaps, small kernels that each cost a few microseconds).
`trace_kernels` records every device kernel of some calls; `summarize` groups them by kernel name
and by HLO op stem (the op name without its numeric suffix, so one row covers that op in every
layer), and says how much of the traced window the device was busy.

On a GPU the kernels are the events of the device plane's stream lines; on the CPU backend (tests),
the thunk executor's events that name their HLO op.
"""

import glob
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import jax
from jax.profiler import ProfileData


@dataclass(frozen=True)
class Kernel:
  name: str  # the kernel (GPU) or thunk (CPU) name
  hlo_op: str  # the HLO instruction it runs for; "" when the trace does not say
  start_ns: float
  duration_ns: float


def _stats(event) -> dict:
  return dict(event.stats) if event.stats else {}


def kernels_of(profile: ProfileData) -> list[Kernel]:
  """Device kernels of a trace; on a backend without device planes, host events naming an HLO op."""
  device = [p for p in profile.planes if p.name.startswith("/device:")]
  out = []
  for plane in device:
    for line in plane.lines:
      if not line.name.startswith("Stream"):
        continue  # derived lines (modules, ops) repeat the stream's time
      for e in line.events:
        out.append(Kernel(e.name, str(_stats(e).get("hlo_op", "")), e.start_ns, e.duration_ns))
  if device:
    return out
  for plane in profile.planes:
    for line in plane.lines:
      for e in line.events:
        stats = _stats(e)
        if "hlo_op" in stats:
          out.append(Kernel(e.name, str(stats["hlo_op"]), e.start_ns, e.duration_ns))
  return out


def trace_kernels(fn: Callable[[], object], calls: int) -> list[Kernel]:
  """Runs fn() `calls` times under the profiler (waiting for the last result) and returns the
  kernels it ran. Call fn once before, so compilation and warm-up stay out of the trace."""
  with tempfile.TemporaryDirectory(prefix="specdec-trace-") as d:
    with jax.profiler.trace(d):
      out = None
      for _ in range(calls):
        out = fn()
      jax.block_until_ready(out)
    files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
    if len(files) != 1:
      raise RuntimeError(f"expected one .xplane.pb under the trace directory, found {files}")
    return kernels_of(ProfileData.from_file(files[0]))


_SUFFIX = re.compile(r"(\.\d+)+$|(_\d+)+$")


def op_stem(hlo_op: str) -> str:
  """'loop_dynamic_update_slice_fusion.35' -> 'loop_dynamic_update_slice_fusion'."""
  return _SUFFIX.sub("", hlo_op)


def busy_ns(kernels: list[Kernel]) -> float:
  """Length of the union of the kernels' intervals (overlapping streams counted once)."""
  total, end = 0.0, -float("inf")
  for k in sorted(kernels, key=lambda k: k.start_ns):
    lo, hi = max(k.start_ns, end), k.start_ns + k.duration_ns
    if hi > lo:
      total += hi - lo
    end = max(end, hi)
  return total


def _group(kernels: list[Kernel], key, per: int, top: int) -> list[dict]:
  acc: dict[str, list[float]] = {}
  for k in kernels:
    acc.setdefault(key(k), []).append(k.duration_ns)
  total = sum(k.duration_ns for k in kernels) or 1.0
  rows = [
    {
      "name": name,
      "per_step": len(d) / per,
      "us_per_step": sum(d) / per / 1e3,
      "share": sum(d) / total,
    }
    for name, d in acc.items()
  ]
  return sorted(rows, key=lambda r: -r["us_per_step"])[:top]


def summarize(kernels: list[Kernel], steps: int, top: int = 25) -> dict:
  """Per-step figures over `steps` steps: kernel count and time, the traced window, the share of
  it the device was busy, and the `top` kernel names and HLO op stems by time."""
  if not kernels:
    raise ValueError("the trace holds no kernels: was the function run under the profiler?")
  window = max(k.start_ns + k.duration_ns for k in kernels) - min(k.start_ns for k in kernels)
  return {
    "kernels_per_step": len(kernels) / steps,
    "kernel_us_per_step": sum(k.duration_ns for k in kernels) / steps / 1e3,
    "window_us_per_step": window / steps / 1e3,
    "busy_fraction": busy_ns(kernels) / window if window else 1.0,
    "by_kernel": _group(kernels, lambda k: op_stem(k.name), steps, top),
    "by_op": _group(kernels, lambda k: op_stem(k.hlo_op) or k.name, steps, top),
  }
