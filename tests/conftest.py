import os

# Tests run on CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No persistent compilation cache in tests: loading a CPU executable from it segfaulted a worker
# (inside jax's compilation_cache.get_executable_and_time), as specdec.xla_env says. A rarer
# crash came without it (an abort inside XLA, a different small test each time, never alone):
# `./dev test` reruns a test once only when its worker crashed (pytest-rerunfailures), and prints
# the rerun. Tests of the cache itself run children with their own setting.
os.environ.setdefault("SPECDEC_COMPILE_CACHE", "off")

# tests/multidevice needs a process with 4 fake CPU devices: tests/test_sharding.py starts one.
collect_ignore = [] if os.environ.get("SPECDEC_MULTIDEVICE") else ["multidevice"]


def pytest_collection_modifyitems(items):
  """Tests marked slow first, the rest in collection order: under pytest-xdist a test of minutes
  (the fake-mesh process above all) started among the last would run alone while the other
  workers idle."""
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)
