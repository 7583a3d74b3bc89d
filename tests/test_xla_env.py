"""specdec's default XLA flags: added unless XLA_FLAGS names them, before JAX starts; recorded."""

import os
import subprocess
import sys

from specdec import xla_env
from specdec.results import environment_fields

FLAG = "--xla_gpu_graph_enable_concurrent_region=true"


def test_defaults_are_added_after_the_users_flags():
  assert xla_env.with_defaults("") == FLAG
  assert (
    xla_env.with_defaults("--xla_dump_to=/tmp/d  --a=1") == f"--xla_dump_to=/tmp/d --a=1 {FLAG}"
  )


def test_a_flag_the_user_names_is_left_as_set():
  off = "--xla_gpu_graph_enable_concurrent_region=false"
  assert xla_env.with_defaults(off) == off
  assert xla_env.with_defaults("xla_gpu_graph_enable_concurrent_region") == (
    "xla_gpu_graph_enable_concurrent_region"
  )


def _run(code: str, xla_flags: str | None) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  if xla_flags is not None:
    env["XLA_FLAGS"] = xla_flags
  return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_importing_specdec_sets_them_for_the_process_and_its_rows():
  code = "import specdec, os, jax; jax.numpy.ones(1); print(os.environ['XLA_FLAGS'])"
  p = _run(code, None)
  assert p.returncode == 0, p.stderr
  assert p.stdout.split() == [FLAG]
  p = _run(code, "--xla_force_host_platform_device_count=2")
  assert p.stdout.split() == ["--xla_force_host_platform_device_count=2", FLAG]
  assert environment_fields()["xla_flags"] == os.environ.get("XLA_FLAGS", "")


def test_a_backend_started_before_specdec_keeps_its_flags_and_warns():
  p = _run(
    "import jax, os; jax.numpy.ones(1); import specdec; print(os.environ.get('XLA_FLAGS'))", None
  )
  assert p.returncode == 0, p.stderr
  assert p.stdout.split() == ["None"]
  assert "imported after JAX started a backend" in p.stderr


def test_kernel_benchmarks_run_their_chains_without_concurrent_regions():
  # The kernel modules must not start a backend on import, so their mains can still turn the
  # concurrent regions off (nvfp4_gemv.bench_start); a started backend makes it refuse.
  code = (
    "import os\n"
    "from jax._src import xla_bridge\n"
    "from kernels_pallas import decode_attention, exl3_gemv, fp8_gemv, nvfp4_gemv\n"
    "assert not xla_bridge.backends_are_initialized()\n"
    "nvfp4_gemv.bench_start()\n"
    "print(os.environ['XLA_FLAGS'])\n"
    "from specdec import xla_env\n"
    "os.environ['XLA_FLAGS'] = ''\n"
    "try:\n"
    "  xla_env.serialize_graphs()\n"
    "except RuntimeError as e:\n"
    "  print('refused:', e)\n"
  )
  p = _run(code, "--xla_dump_to=/tmp/x")
  assert p.returncode == 0, p.stderr
  lines = p.stdout.splitlines()
  assert lines[1].split() == ["--xla_dump_to=/tmp/x", FLAG.replace("true", "false")]
  assert lines[2].startswith("refused: a kernel benchmark needs XLA_FLAGS without concurrent")
