import os

# Tests run on CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No persistent compilation cache in tests: workers crashed inside jax's cache twice with one shared
# directory, and once more with a directory per worker; never alone. Tests of the cache itself run
# children with their own setting.
os.environ.setdefault("SPECDEC_COMPILE_CACHE", "off")

# tests/multidevice needs a process with 4 fake CPU devices: tests/test_sharding.py starts one.
collect_ignore = [] if os.environ.get("SPECDEC_MULTIDEVICE") else ["multidevice"]
