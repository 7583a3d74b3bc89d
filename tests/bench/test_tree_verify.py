"""experiments.bench_tree_verify: a tiny run writes every arm (run as a process: it owns flags)."""

import json
import subprocess
import sys
from pathlib import Path

from specdec.decoding.tree import binary_paths, tree

ROOT = Path(__file__).resolve().parents[2]
ARMS = ("chain", "chain_xla", "tree")


def test_tiny_run_writes_every_arm(tmp_path):
  cmd = [
    sys.executable, "-m", "experiments.bench_tree_verify", "--tiny", f"--out={tmp_path}",
    "--contexts=32", "--widths=4,8", "--n_steps=2", "--reps=1",
  ]  # fmt: skip
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "bench_tree_verify.json").read_text())
  (row,) = result["contexts"]
  assert row["context"] == 32 and set(row["widths"]) == {"4", "8"}
  for w, r in row["widths"].items():
    assert all(f"{arm}_us" in r and f"{arm}_vs_width1" in r for arm in ARMS)
    assert r["tree_depth"] == tree(binary_paths(int(w))).depth
