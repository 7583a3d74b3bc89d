"""experiments.bench_hybrid runs end to end on its tiny shape and writes every figure it names."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_run_writes_decode_verify_and_moe_figures(tmp_path):
  cmd = [
    sys.executable, "-m", "experiments.bench_hybrid", "--shape=tiny", f"--out={tmp_path}",
    "--contexts=64", "--widths=1,4", "--moe_tokens=1,16", "--n_steps=2", "--reps=1",
  ]  # fmt: skip
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "bench_hybrid.json").read_text())
  assert result["batch"] == 1 and "linear_attention" in result["layer_types"]
  assert [r["context"] for r in result["contexts"]] == [64]
  for row in result["contexts"]:
    assert set(row["verify"]) == {"1", "4"}
    assert row["verify"]["1"]["vs_decode_step"] == 1.0
    b = row["bytes_read"]
    assert b["weights"] > 0 and b["routed_experts"] > 0 and b["recurrent_state"] > 0
    assert b["kv"] == 2 * row["context"] * 2 * 16 * 4  # one attention layer, K = 2, H = 16, f32
  moe_rows = {(r["tokens"], r["implementation"]) for r in result["moe"]}
  assert moe_rows == {(1, "gather"), (1, "ragged"), (16, "ragged")}  # 16 x 2 > 2 x 8 experts
  assert all(1 <= r["experts_hit"] <= 8 for r in result["moe"])


def test_dense_shape_is_a_hybrid_without_experts():
  """Checked in a child process: a test process loads at most one experiment main's flags."""
  check = (
    "from experiments import bench_hybrid as b; c = b.hybrid_config(b.DENSE_27B_LIKE); "
    "assert not any(c.moe_layers) and c.num_experts == 0; "
    "assert c.layer_types.count('full_attention') == 16 and len(c.layer_types) == 64"
  )
  proc = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
