"""specdec's default XLA flags: the entry points add them unless XLA_FLAGS names them; recorded."""

import ast
import os
import subprocess
import sys
from pathlib import Path

from specdec import xla_env
from specdec.lab.results import environment_fields

ROOT = Path(__file__).resolve().parents[1]
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


def test_importing_the_library_changes_no_environment_variable():
  code = (
    "import os; before = dict(os.environ)\n"
    "import specdec, specdec.drafters, specdec.decoding.generate, specdec.lab.driver\n"
    "import kernels_pallas.nvfp4_gemv, specdec.bench.decode\n"
    "specdec.generate, specdec.load, specdec.Sampling\n"
    "# jax and Mosaic set their own (TF_CPP_MIN_LOG_LEVEL, MOSAIC_GPU_CUDA_ROOT, ...)\n"
    "print(all(os.environ.get(k) == before.get(k) for k in ('XLA_FLAGS', 'SPECDEC_ATTENTION')))\n"
  )
  p = _run(code, None)
  assert p.returncode == 0, p.stderr
  assert p.stdout.split() == ["True"]


def test_apply_defaults_sets_them_for_the_process_and_its_rows():
  code = (
    "import os, jax; from specdec import xla_env; xla_env.apply_defaults(); "
    "jax.numpy.ones(1); print(os.environ['XLA_FLAGS'])"
  )
  p = _run(code, None)
  assert p.returncode == 0, p.stderr
  assert p.stdout.split() == [FLAG]
  p = _run(code, "--xla_force_host_platform_device_count=2")
  assert p.stdout.split() == ["--xla_force_host_platform_device_count=2", FLAG]
  assert environment_fields()["xla_flags"] == os.environ.get("XLA_FLAGS", "")


def test_a_backend_started_before_apply_defaults_keeps_its_flags_and_warns():
  p = _run(
    "import jax, os; jax.numpy.ones(1); from specdec import xla_env; xla_env.apply_defaults(); "
    "print(os.environ.get('XLA_FLAGS'))",
    None,
  )
  assert p.returncode == 0, p.stderr
  assert p.stdout.split() == ["None"]
  assert "after JAX started a backend" in p.stderr


def test_every_experiment_main_that_runs_jax_applies_them_first():
  no_jax = {"table.py", "build_corpus.py", "__init__.py"}
  for path in sorted((ROOT / "experiments").glob("*.py")):
    if path.name in no_jax:
      continue
    tree = ast.parse(path.read_text())
    main = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main")
    calls = [ast.unparse(s) for s in main.body[:3]]
    assert "xla_env.apply_defaults()" in calls, path.name


def test_kernel_benchmarks_run_their_chains_without_concurrent_regions():
  # The kernel modules (and the benchmark entry point) must not start a backend on import, so
  # experiments/bench_kernel.py can still turn the concurrent regions off before the kernel's
  # benchmark runs (here a stand-in that prints the flags); a started backend makes it refuse.
  code = (
    "import os\n"
    "from absl import flags\n"
    "from jax._src import xla_bridge\n"
    "from kernels_pallas import decode_attention, exl3_gemv, fp8_gemv, nvfp4_gemv\n"
    "from experiments import bench_kernel\n"
    "assert not xla_bridge.backends_are_initialized()\n"
    "nvfp4_gemv.main = lambda **kw: print(os.environ['XLA_FLAGS'])\n"
    "flags.FLAGS(['bench_kernel', '--kernel=nvfp4'])\n"
    "bench_kernel.main([])\n"
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


def _cache_dir_in_child(tmp_path, **env) -> str:
  code = (
    "import jax, json; from specdec import xla_env; d = xla_env.enable_compile_cache(); "
    "jax.jit(lambda x: x + 1)(1.0).block_until_ready(); "
    "print(json.dumps([d, jax.config.jax_compilation_cache_dir]))"
  )
  base = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("JAX_COMPILATION_CACHE", "SPECDEC_COMPILE_CACHE"))
  }
  base |= {"XDG_CACHE_HOME": str(tmp_path), "JAX_PLATFORMS": "cpu", **env}
  out = subprocess.run(
    [sys.executable, "-c", code], env=base, cwd=ROOT, capture_output=True, text=True, check=True
  )
  return out.stdout.strip().splitlines()[-1]


def test_the_persistent_compile_cache_is_off_on_the_cpu_unless_a_directory_is_named(tmp_path):
  # On a GPU the default is the user cache dir (default_cache_dir); CPU loads have crashed.
  assert _cache_dir_in_child(tmp_path) == "[null, null]"
  assert not (tmp_path / "specdec").exists()
  assert _cache_dir_in_child(tmp_path, SPECDEC_COMPILE_CACHE="off") == "[null, null]"
  mine = tmp_path / "mine"
  env = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  got = _cache_dir_in_child(tmp_path, SPECDEC_COMPILE_CACHE=str(mine), **env)
  assert got == f'["{mine}", "{mine}"]'
  assert any(mine.iterdir())  # the executable was written there


def test_the_default_cache_dir_is_under_the_user_cache_home(tmp_path, monkeypatch):
  from specdec import xla_env

  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert xla_env.default_cache_dir() == tmp_path / "specdec" / "jax"
