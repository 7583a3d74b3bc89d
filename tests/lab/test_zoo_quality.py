"""specdec.lab.zoo_quality: which k each drafter is measured at and how the bars are read."""

from specdec.lab.zoo_quality import bar_checks, quality_ks


def test_block_drafters_are_measured_at_their_block_size_too():
  assert quality_ks("eagle3") == (4, 8)
  assert quality_ks("block8") == (4, 7, 8) and quality_ks("block16") == (4, 8, 15)
  assert quality_ks("dspark") == (4, 8)  # its anchor row drafts too: b = 8 drafts per forward


def row(drafter, k, tau, temperature=0.0):
  return dict(drafter=drafter, k=k, tau=tau, temperature=temperature)


def test_bars_read_greedy_rows_at_the_bar_k_and_dflash2_dspark_against_block8():
  rows = [
    row("eagle3", 8, 4.2), row("eagle3", 4, 3.0), row("eagle3", 8, 9.9, temperature=0.6),
    row("block8", 7, 3.5), row("block8", 8, 9.0), row("dflash2", 7, 3.6),
    row("block16", 15, 4.4), row("draft_lm", 8, 3.0), row("dspark", 8, 3.4), row("dspark", 7, 9.0),
  ]  # fmt: skip
  got = {c["drafter"]: (c["k"], c["tau"], c["bar"], c["met"]) for c in bar_checks(rows)}
  assert got == {
    "eagle3": (8, 4.2, 4.0, True), "block8": (7, 3.5, 4.0, False),
    "block16": (15, 4.4, 4.5, False), "draft_lm": (8, 3.0, 3.0, True),
    "dflash2": (7, 3.6, 3.5, True), "dspark": (8, 3.4, 3.5, False),
  }  # fmt: skip


def test_zoo_quality_refuses_unknown_or_missing_drafters_in_one_line(tmp_path):
  import os
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  cmd = [sys.executable, "-m", "experiments.zoo_quality", f"--zoo_dir={tmp_path}"]
  for flag, says in [
    ("--models=bogus", "--models: each must be one of draft_lm, mtp, eagle3"),
    ("--models=eagle3_ttt4", f"no such drafter directory: {tmp_path}/eagle3_ttt4"),
  ]:
    proc = subprocess.run(cmd + [flag], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert says in proc.stderr
