"""Runs tests/multidevice in one process with a fake 4-device CPU platform (the flag must be set
before JAX starts, so not in this process): one JAX start for every file, and the executables one
file compiles (the single-device baselines, a sweep's cells) are there for the next."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_tensor_parallel_on_a_fake_four_device_mesh():
  # pytest exits non-zero when it collects nothing, so an emptied directory fails here too.
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "SPECDEC_MULTIDEVICE": "1"}
  env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4"
  r = subprocess.run(
    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/multidevice"],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
  )  # fmt: skip
  assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
