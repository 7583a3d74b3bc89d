"""experiments.bench_lowering: every arm lowers for cuda on the CPU, the kernel where asked (run
as a process: it owns flags)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_arm_lowers_and_only_the_kernel_arms_hold_the_kernel(tmp_path):
  cmd = [sys.executable, "-m", "experiments.bench_lowering", f"--out={tmp_path}", "--reps=1"]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "bench_lowering.json").read_text())
  assert result["shape"]["layers"] == 12
  arms = {(r["layers"], r["attention"]): r for r in result["rows"]}
  assert set(arms) == {(a, b) for a in ("apply_layer", "loop") for b in ("kernel", "xla")}
  for (_, attention), r in arms.items():
    assert r["kernel"] == (attention == "kernel")
    assert len(r["seconds"]) == 1 and r["seconds"][0] > 0
