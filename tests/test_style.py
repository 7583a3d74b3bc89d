"""One formatter and linter for the whole tree."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff():
  local = Path(sys.executable).parent / "ruff"
  return str(local) if local.exists() else shutil.which("ruff")


def test_ruff_check_is_clean():
  r = subprocess.run([_ruff(), "check", "."], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_clean():
  r = subprocess.run([_ruff(), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 0, r.stdout + r.stderr
