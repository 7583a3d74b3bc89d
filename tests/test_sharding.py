"""Runs tests/multidevice in a process with a fake 4-device CPU platform (the flag must be set
before JAX starts, so not in this process)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tensor_parallel_on_a_fake_four_device_mesh():
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "SPECDEC_MULTIDEVICE": "1"}
  env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4"
  r = subprocess.run(
    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/multidevice"],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
  )  # fmt: skip
  assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
