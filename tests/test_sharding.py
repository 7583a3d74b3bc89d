"""Runs tests/multidevice in processes with a fake 4-device CPU platform (the flag must be set
before JAX starts, so not in this process): one process per file, so pytest-xdist spreads them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p.name for p in (ROOT / "tests" / "multidevice").glob("test_*.py"))


def test_every_multidevice_file_runs_here():
  assert len(FILES) >= 3, FILES


@pytest.mark.parametrize("name", FILES)
def test_tensor_parallel_on_a_fake_four_device_mesh(name):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "SPECDEC_MULTIDEVICE": "1"}
  env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4"
  r = subprocess.run(
    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/multidevice/{name}"],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
  )  # fmt: skip
  assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
