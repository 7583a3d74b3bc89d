import os

# Tests run on CPU; a local persistent cache makes re-runs fast (CI starts empty).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One cache directory per xdist worker: two processes reading and writing one directory at once
# crashed a worker inside the cache (seen twice, not reproduced alone).
_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", os.path.expanduser(f"~/.cache/specdec-jax/{_worker}")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

# tests/multidevice needs a process with 4 fake CPU devices: tests/test_sharding.py starts one.
collect_ignore = [] if os.environ.get("SPECDEC_MULTIDEVICE") else ["multidevice"]
