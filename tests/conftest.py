import os

import pytest

# Tests run on CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No persistent compilation cache in tests: loading a CPU executable from it segfaulted a worker
# (inside jax's compilation_cache.get_executable_and_time), as specdec.xla_env says. A rarer
# crash came without it (a segfault inside an XLA compile, late in a worker's run, never alone):
# see `_bounded_memory_maps` below. `./dev test` reruns a test once only when its worker crashed
# (pytest-rerunfailures), and prints the rerun. Tests of the cache itself run children with their
# own setting.
os.environ.setdefault("SPECDEC_COMPILE_CACHE", "off")

# Most tests compile far more than they compute, so XLA compiles with its cheapest settings (the
# fake-mesh child inherits this); a test marked `optimized` computes enough for the full
# optimizations to pay (`_full_optimizations` below). Suite times: docs/benchmarks.md.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

# tests/multidevice needs a process with 4 fake CPU devices: tests/test_sharding.py starts one.
collect_ignore = [] if os.environ.get("SPECDEC_MULTIDEVICE") else ["multidevice"]


def pytest_collection_modifyitems(items):
  """Tests marked slow first, the rest in collection order: under pytest-xdist a test of minutes
  (the fake-mesh process above all) started among the last would run alone while the other
  workers idle."""
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _full_optimizations(request):
  """XLA's full optimizations for the duration of a test marked `optimized`."""
  if request.node.get_closest_marker("optimized") is None:
    yield
    return
  import jax

  before = jax.config.values["jax_disable_most_optimizations"]
  jax.config.update("jax_disable_most_optimizations", False)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture(autouse=True)
def _bounded_memory_maps():
  """After a test that leaves the process above the mapping budget, drop jax's compiled
  executables (later tests recompile what they need): one process running tests/decoding reached
  40,000 mappings in 4 minutes (`specdec.lab.mappings`)."""
  yield
  from specdec.lab import mappings

  mappings.release_if_over(mappings.map_budget())
