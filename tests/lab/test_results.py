import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from specdec.lab import results
from tests.helpers import result_row as make_row


def test_append_and_load_roundtrip_with_nan_and_numpy(tmp_path):
  path = tmp_path / "results.jsonl"
  written = results.append_row(
    path,
    make_row(
      tau=np.float32(1.5),
      per_position_cond=np.array([0.5, np.nan]),
      accept_hist=np.array([[1, 2, 3]]),
      ctx_edges=(0, math.inf),
      acceptance_rate=math.nan,
    ),
  )
  assert written["per_position_cond"] == [0.5, None]
  rows = results.load_rows(path)
  assert rows == [written]
  assert rows[0]["ctx_edges"] == [0, None] and rows[0]["accept_hist"] == [[1, 2, 3]]
  assert "NaN" not in path.read_text()  # strict JSON on disk


def test_validate_row_names_problems():
  with pytest.raises(results.ResultsError) as e:
    results.validate_row({**make_row(k="2", taus=1.0), "gate_passed": None})
  msg = str(e.value)
  assert "k should be int" in msg and "unknown field 'taus'" in msg and "gate_passed" in msg
  row = make_row()
  del row["device"]
  with pytest.raises(results.ResultsError, match="missing device"):
    results.validate_row(row)
  results.validate_row(make_row(tau=None, decode_tok_s=3, extra={"anything": [1]}))
  with pytest.raises(results.ResultsError, match="k should be int"):
    results.validate_row(make_row(k=True))


def test_every_design7_field_is_required():
  design7 = [
    "method", "k", "prompt_tokens", "ctx_bucket", "temperature", "top_k", "top_p", "acceptance",
    "target_format", "kv_dtype", "batch", "device", "jax_version", "git_commit", "seed",
    "timestamp", "leg", "gate_passed",
  ]  # fmt: skip
  assert all(results.ROW_FIELDS[f].required for f in design7)


def test_truncated_last_line_ignored_and_repaired(tmp_path):
  path = tmp_path / "results.jsonl"
  results.append_row(path, make_row(leg=0))
  with open(path, "ab") as f:
    f.write(json.dumps(make_row(leg=1)).encode()[:40])  # a write cut short
  assert [r["leg"] for r in results.load_rows(path)] == [0]
  results.append_row(path, make_row(leg=1))
  assert [r["leg"] for r in results.load_rows(path)] == [0, 1]
  assert path.read_text().count("\n") == 2


def test_corrupt_middle_line_names_file_and_line(tmp_path):
  path = tmp_path / "results.jsonl"
  results.append_row(path, make_row(leg=0))
  with open(path, "a") as f:
    f.write("{not json\n")
  results.append_row(path, make_row(leg=1))
  with pytest.raises(results.ResultsError, match=rf"{path}:2: corrupt"):
    results.load_rows(path)
  path.write_text("[1, 2]\n")
  with pytest.raises(results.ResultsError, match=":1: result row is not a JSON object"):
    results.load_rows(path)


def test_missing_file_is_empty(tmp_path):
  assert results.load_rows(tmp_path / "none.jsonl") == []
  assert results.finished_cells(tmp_path / "none.jsonl") == set()


def test_finished_cells(tmp_path):
  path = tmp_path / "results.jsonl"
  for leg in (0, 1):
    results.append_row(path, make_row(leg=leg))
  results.append_row(path, make_row(method="null", k=0, leg=0))
  done = results.finished_cells(path)
  assert results.row_key(make_row(leg=1)) in done
  assert results.row_key(make_row(leg=2)) not in done
  assert results.row_key(make_row(method="null", k=0, leg=1)) not in done
  by_cell = results.finished_cells(path, results.cell_key)
  assert len(by_cell) == 2


_WRITER = textwrap.dedent(
  """
  import sys
  from specdec.lab import results
  path, start = sys.argv[1], int(sys.argv[2])
  row = {row!r}
  hist = [[j for j in range(9)] for _ in range(64)]  # big rows make a mid-write kill likelier
  i = start
  while True:
    results.append_row(path, dict(row, leg=i, accept_hist=hist))
    i += 1
  """
)


def _run_writer_until(path, start, min_rows):
  script = _WRITER.format(row=make_row())
  proc = subprocess.Popen([sys.executable, "-c", script, str(path), str(start)])
  try:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
      if path.exists() and path.read_bytes().count(b"\n") >= min_rows:
        break
      time.sleep(0.01)
    else:
      raise AssertionError("writer made no progress")
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  assert proc.returncode == -signal.SIGKILL


def test_sigkill_mid_run_then_resume(tmp_path):
  path = tmp_path / "results.jsonl"
  _run_writer_until(path, 0, 20)
  rows = results.load_rows(path)
  legs = [r["leg"] for r in rows]
  assert len(legs) >= 20 and legs == list(range(len(legs)))
  assert all(r["accept_hist"][63][8] == 8 for r in rows)

  # Simulate the worst case a kill can leave (a partial line), then resume from the finished set.
  with open(path, "ab") as f:
    f.write(b'{"method": "ngr')
  done = results.finished_cells(path)
  start = len(done)
  _run_writer_until(path, start, start + 10)
  legs = [r["leg"] for r in results.load_rows(path)]
  assert legs == list(range(len(legs))) and len(legs) >= start + 10


def test_write_config_and_resume_check(tmp_path):
  out = tmp_path / "sweep"
  cfg = {"ks": (1, 2, 4), "sampling": {"temperature": 0.6}, "out": str(out), "seed": 0}
  assert results.write_config(out, cfg) is False
  stored = json.loads((out / "config.json").read_text())
  assert stored["ks"] == [1, 2, 4]
  assert not [p for p in os.listdir(out) if p.startswith(".")]  # no temp file left behind
  # Same sweep, different volatile field: a resume.
  assert results.write_config(out, {**cfg, "out": "elsewhere"}) is True
  bad = {**cfg, "ks": [1, 2, 8], "sampling": {"temperature": 1.0}}
  with pytest.raises(results.ResultsError) as e:
    results.write_config(out, bad)
  msg = str(e.value)
  assert "ks: stored [1, 2, 4], now [1, 2, 8]" in msg and "sampling.temperature" in msg
  assert "seed" not in msg
  # Only the named fields define the sweep when given.
  assert results.write_config(out, bad, defining_fields=["seed"]) is True


def test_unwritable_out_is_a_clear_error(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(results.ResultsError, match="not a writable directory"):
    results.prepare_out_dir(blocker / "sub")
  if os.geteuid() != 0:  # root ignores permission bits
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(results.ResultsError, match="--out="):
      results.prepare_out_dir(ro)


def test_environment_fields():
  env = results.environment_fields()
  assert set(env) == {
    "device",
    "jax_version",
    "git_commit",
    "git_dirty",
    "timestamp",
    "attention",
    "xla_flags",
  }
  assert env["jax_version"].count(".") >= 1
  assert env["git_commit"] == "unknown" or len(env["git_commit"]) == 40
  results.validate_row(make_row(**env))


def test_environment_records_the_attention_path(monkeypatch):
  assert results.environment_fields()["attention"] == "auto"
  monkeypatch.setenv("SPECDEC_ATTENTION", "xla")
  assert results.environment_fields()["attention"] == "xla"
