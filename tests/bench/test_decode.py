"""specdec.bench.decode, the decode benchmark's driver: a spent budget, and the whole experiment on
the tiny preset (timings themselves are not asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from configs import bench_decode as bench_config
from specdec.bench import decode, decode_config, decode_parts, decode_report, random_models
from specdec.xla_env import with_defaults

ROOT = Path(__file__).resolve().parents[2]


def test_every_part_name_has_a_part():
  assert tuple(decode_parts.BY_NAME) == decode_config.PARTS


def test_spent_budget_records_skips_without_measuring(tmp_path):
  cfg = bench_config.get_config("tiny")
  cfg.budget_s = 1e-9
  rows = decode.Runner(cfg, str(tmp_path)).run()
  assert rows and all(r["skipped"] == "time budget spent" for r in rows)
  assert "skipped: time budget spent" in decode_report.markdown(rows)


def test_experiment_runs_every_part_on_the_tiny_preset(tmp_path):
  cmd = [sys.executable, "-m", "experiments.bench_decode", "--config=configs/bench_decode.py:tiny"]
  proc = subprocess.run(
    [*cmd, f"--out={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=600
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
  assert not [r for r in rows if "error" in r or "skipped" in r]
  parts = [r["part"] for r in rows]
  assert parts == ["copy"] + ["decode"] * 6 + ["verify"] * 2 + ["attention"] * 2 + ["loop"] + [
    "flags"
  ] * 2 + ["compile"] * 2 + ["profile"]

  arms = [(r["xla_flags"], r["fused"], r["attention"]) for r in rows if r["part"] == "flags"]
  # Each arm's flags as its process ran them: the arm's, then specdec's defaults.
  assert arms == [
    (with_defaults(""), True, "xla"),
    (with_defaults("--xla_gpu_enable_triton_gemm=false"), False, "auto"),
  ]
  assert "concurrent_region=true" in arms[1][0]

  decodes = [r for r in rows if r["part"] == "decode"]
  assert [(r["format"], r["kv_dtype"]) for r in decodes] == [
    (f, kv) for f in random_models.FORMATS for kv in ("model", "float8_e4m3fn")
  ]
  for r in decodes:
    assert r["tok_s"] == pytest.approx(r["batch"] / (r["us"] * 1e-6))
    assert r["us_min"] <= r["us"] <= r["us_max"]
    assert r["pct_of_measured_copy"] > 0
  assert decodes[2]["weight_bytes"] < decodes[0]["weight_bytes"]  # NVFP4 stores less than bf16
  assert decodes[1]["kv_bytes"] * 2 == decodes[0]["kv_bytes"]  # FP8 codes: half of bf16's

  for r in (r for r in rows if r["part"] == "attention"):
    assert r["rel_err_vs_f32"] < 1e-2  # bf16 inputs, f32 accumulation

  (loop,) = (r for r in rows if r["part"] == "loop")
  assert loop["xla_flags"] == with_defaults("--xla_gpu_enable_command_buffer=")
  assert loop["hlo_copies"]["body"]["n"] == 0
  assert (tmp_path / loop["hlo_file"]).read_text().startswith("HloModule")

  cold, cached = (r for r in rows if r["part"] == "compile")
  assert (cold["cache_hits"], cached["cache_hits"]) == (0, 1)

  (prof,) = (r for r in rows if r["part"] == "profile")
  assert prof["kernels_per_step"] > 0 and 0 < prof["busy_fraction"] <= 1
  assert sum(g["share"] for g in prof["by_op"]) <= 1 + 1e-9
  assert (tmp_path / prof["hlo_file"]).read_text().startswith("HloModule")

  table = (tmp_path / "table.md").read_text()
  assert "| tiny | nvfp4 | yes | float8_e4m3fn | 2 | 16 |" in table
  assert "### Compile of the decode chunk" in table
  assert "### Profile: tiny bf16, fused projections B = 1 ctx 16" in table
  assert table.strip() in proc.stdout
