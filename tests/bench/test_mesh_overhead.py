"""experiments.bench_mesh_overhead runs both arms on its tiny shape, gated on identical tokens."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_run_times_both_arms_after_the_gate(tmp_path):
  cmd = [
    sys.executable, "-m", "experiments.bench_mesh_overhead", "--tiny", f"--out={tmp_path}",
    "--prompt_tokens=40", "--max_new_tokens=8", "--legs=2",
  ]  # fmt: skip
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "bench_mesh_overhead.json").read_text())
  assert set(result["methods"]) == {"null", "ngram"}
  for r in result["methods"].values():
    assert r["gate"] == "greedy tokens identical"
    assert [len(v) for v in r["step_s"].values()] == [2, 2]
    lo, hi = r["ratio_range"]
    assert 0 < lo <= r["ratio_median"] <= hi
