import os

# Tests run on CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent-cache directory per xdist worker (CI starts empty; local re-runs load).
# A worker has crashed inside XLA now and then (a segfault or an abort, in a different test each
# time, with or without this cache; never reproduced alone): `./dev test` reruns a test once only
# when its worker crashed (pytest-rerunfailures), and prints the rerun.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", os.path.expanduser(f"~/.cache/specdec-jax/{_worker}")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

# tests/multidevice needs a process with 4 fake CPU devices: tests/test_sharding.py starts one.
collect_ignore = [] if os.environ.get("SPECDEC_MULTIDEVICE") else ["multidevice"]
