"""experiments.bench_tree_verify: its trees have the stated shape; a tiny run writes every arm."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.bench_tree_verify import ARMS, binary_paths
from specdec.decoding.tree import tree

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("n, depth", [(2, 1), (3, 1), (4, 2), (7, 2), (8, 3), (64, 6)])
def test_binary_paths_make_an_n_node_tree(n, depth):
  t = tree(binary_paths(n))
  assert (t.size, t.depth) == (n, depth)
  assert max(max(p) for p in t.paths) <= 1  # at most two children a node


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
