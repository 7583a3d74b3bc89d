"""specdec.bench.gpu_profile: kernels read back from a real profiler trace, the per-step summary."""

import jax
import jax.numpy as jnp
import pytest

from specdec.bench import gpu_profile
from specdec.bench.gpu_profile import Kernel


def test_trace_finds_each_call_of_a_jitted_function():
  x = jnp.ones((64, 64))
  f = jax.jit(lambda x: jnp.tanh(x @ x) + 1.0)
  f(x).block_until_ready()
  calls = 4
  kernels = gpu_profile.trace_kernels(lambda: f(x), calls)
  per_op = {}
  for k in kernels:
    per_op[k.hlo_op] = per_op.get(k.hlo_op, 0) + 1
  # Every op of the function ran once per call: the trace neither misses nor repeats calls.
  assert per_op and set(per_op.values()) == {calls}, per_op


def test_summary_groups_per_step_and_counts_overlap_once():
  ks = [
    Kernel("gemm_1", "dot.3", 0, 10),
    Kernel("gemm_2", "dot.7", 5, 10),  # overlaps the first: busy 0-15
    Kernel("add_fusion", "add_fusion.1", 20, 4),
    Kernel("add_fusion", "add_fusion.12", 30, 4),
  ]
  s = gpu_profile.summarize(ks, steps=2)
  assert s["kernels_per_step"] == 2
  assert s["kernel_us_per_step"] == pytest.approx(28 / 2 / 1e3)
  assert s["window_us_per_step"] == pytest.approx(34 / 2 / 1e3)
  assert s["busy_fraction"] == pytest.approx((15 + 4 + 4) / 34)
  by_op = {g["name"]: g for g in s["by_op"]}
  assert by_op["dot"]["per_step"] == 1 and by_op["add_fusion"]["per_step"] == 1
  assert by_op["dot"]["share"] == pytest.approx(20 / 28)
  assert [g["name"] for g in s["by_kernel"]] == ["gemm", "add_fusion"]


def test_empty_trace_is_an_error():
  with pytest.raises(ValueError, match="no kernels"):
    gpu_profile.summarize([], steps=1)
