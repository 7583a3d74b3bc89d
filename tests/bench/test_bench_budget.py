"""experiments.bench_budget: a tiny run gates and times every arm (run as a process: it owns
flags). Miss rates 0 and 1 make every tau exact."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEW, SWITCH = 16, 8


def _tau(k: int, switch: int) -> float:
  """Emitted / forwards when drafts before generated position `switch` hit and none after."""
  g, steps = 1, 0
  while g < NEW:
    g += min(min(max(switch - g, 0), k) + 1, NEW - g)
    steps += 1
  return (NEW - 1) / steps


@pytest.mark.parametrize("batch,temperature", [(1, 0.0), (2, 0.6)])
def test_tiny_run_gates_and_times_every_arm(tmp_path, batch, temperature):
  cmd = [
    sys.executable, "-m", "experiments.bench_budget", "--tiny", f"--out={tmp_path}",
    "--prompt_tokens=40", f"--max_new_tokens={NEW}", "--legs=1", "--ks=1,2", "--trees=binary3",
    "--profiles=high,high_low", "--miss_high=0", "--miss_low=1", "--step_costs=1,1.1,1.2,1.4",
    f"--batch={batch}", f"--temperature={temperature}",
  ]  # fmt: skip
  env = dict(os.environ, SPECDEC_STEP_COSTS=str(tmp_path / "costs"))
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = json.loads((tmp_path / "bench_budget.json").read_text())
  assert r["walk_matches_greedy"] and r["legs"] == 1 and r["cost_curve"] == "given"
  assert r["batch"] == batch and r["temperature"] == temperature
  assert r["plain"]["gate"] == "greedy tokens identical" and r["plain"]["tok_s"]["median"] > 0
  assert set(r["profiles"]) == {"high", "high_low"}
  for name, switch in (("high", NEW), ("high_low", SWITCH)):
    p = r["profiles"][name]
    assert list(p["arms"]) == ["k=1", "k=2", "auto", "binary3"]
    assert all(a["gate"] == "greedy tokens identical" for a in p["arms"].values())
    assert all(a["tok_s"]["median"] > 0 and a["vs_plain"]["median"] > 0 for a in p["arms"].values())
    for arm, k in (("k=1", 1), ("k=2", 2), ("binary3", 1)):  # binary3: depth 1
      assert abs(p["arms"][arm]["tau"]["median"] - _tau(k, switch)) < 1e-9, (name, arm)
    assert p["best_fixed_k"] in (1, 2) and p["auto_vs_best_fixed"]["median"] > 0
    assert isinstance(p["bar_met"], bool) and p["acceptance_changes"] == (name == "high_low")
    assert p["trees"]["binary3"]["matched_chain"] == "k=2"
  assert "auto / best fixed" in proc.stdout and "binary3 vs k=2" in proc.stdout
