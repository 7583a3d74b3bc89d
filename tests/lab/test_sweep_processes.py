"""A sweep spread over processes (specdec.lab.processes): each (cell, leg) runs once, in the
process that runs its no-draft arm; 2 and 3 jax.distributed CPU processes write the rows one
process writes; a killed process loses only its cell in flight; mismatched configs stop early."""

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from specdec.lab import processes, results, sweep
from specdec.lab.sweep import Cell, SweepError
from tests.lab.test_sweep import FLAGS

# What may differ between two runs of one cell: when and how fast it ran, what it compiled.
VOLATILE = {"timestamp", "compiles", "compile_s", "requests", "wall_s", "git_dirty"}
VOLATILE |= {"decode_tok_s", "whole_tok_s", "tpot_ms_mean", "ttft_ms_median", "ttft_ms_p90"}
VOLATILE |= {"ttft_ms_p99"}


# Two contexts x two legs: four groups of cells (each with its no-draft arm), 16 (cell, leg)s.
SWEEP = [f for f in FLAGS if not f.startswith("--config.prompt_tokens")]
SWEEP += ["--config.prompt_tokens=(0,64)"]


def cells(*methods_ks):
  base = Cell("null", 0, "w", 0, 0.0, 0, 1.0, "greedy", "bf16", "model", 1, 0)
  return [dataclasses.replace(base, method=m, k=k) for m, k in methods_ks]


def test_owners_keep_each_cell_with_its_baseline_round_robin():
  cs = cells(("null", 0), ("ngram", 1), ("ngram", 3))
  other = [dataclasses.replace(c, prompt_tokens=64) for c in cs]
  units = [(leg, c) for leg in range(2) for c in cs + other]
  own = processes.owners(units, 3)
  by_group = {}
  for (leg, c), o in zip(units, own, strict=True):
    by_group.setdefault(sweep.baseline_key(c, leg), set()).add(o)
  assert all(len(v) == 1 for v in by_group.values())  # a group never splits
  assert own == [0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 0, 0]  # 4 groups, round-robin over 3
  assert processes.owners(units, 1) == [0] * len(units)
  with pytest.raises(SweepError, match="--num_processes=5: more processes than the sweep's 4"):
    processes.owners(units, 5)


def test_a_process_with_another_config_stops_every_process():
  published = []

  def agree_with(others):
    def agree(name, value):
      published.append((name, value))
      return [others, value, others]

    return agree

  cfg = {"ks": [1]}
  processes.check_same_config(processes.Processes(1, 3, agree_with(processes.digest(cfg))), cfg)
  assert published == [("config", processes.digest(cfg))]
  with pytest.raises(SweepError, match=r"process\(es\) \[1\] run a different config"):
    processes.check_same_config(processes.Processes(1, 3, agree_with("0" * 16)), cfg)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _launch(out, n, extra=(), last=()):
  """n sweep processes (n = 1: no jax.distributed); `last`: flags of the last process only."""
  port = _free_port()
  env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"}
  cmd = [sys.executable, "-m", "experiments.sweep", *SWEEP, f"--out={out}", "--noplots",
         "--compile_workers=0", *extra]  # fmt: skip
  pipes = dict(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  if n == 1:
    return [subprocess.Popen(cmd, **pipes)]
  dist = [f"--num_processes={n}", f"--coordinator=localhost:{port}"]
  return [
    subprocess.Popen([*cmd, *dist, f"--process_id={i}", *(last if i == n - 1 else ())], **pipes)
    for i in range(n)
  ]


def _wait(procs, timeout=300):
  errs = [p.communicate(timeout=timeout)[1].decode() for p in procs]
  return [p.returncode for p in procs], errs


def _stable(rows):
  """Each row without its timings; of `extra`, everything but the per-call compile counts."""

  def keep(r):
    extra = {k: v for k, v in r["extra"].items() if k != "calls"}
    return {**{k: v for k, v in r.items() if k not in VOLATILE}, "extra": extra}

  return sorted(repr(sorted(keep(r).items())) for r in rows)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
  out = tmp_path_factory.mktemp("one") / "run"
  codes, errs = _wait(_launch(out, 1))
  assert codes == [0], errs
  return results.load_rows(out / results.RESULTS_NAME)


@pytest.mark.parametrize("n", [2, 3])
def test_n_processes_write_the_rows_one_process_writes(tmp_path, single, n):
  out = tmp_path / "run"
  codes, errs = _wait(_launch(out, n))
  assert codes == [0] * n, errs
  rows = results.load_rows(out / results.RESULTS_NAME)
  assert len(rows) == len(single) == 16
  assert _stable(rows) == _stable(single)


def test_a_killed_process_loses_only_its_cell_in_flight(tmp_path, single):
  out = tmp_path / "run"
  path = out / results.RESULTS_NAME
  procs = _launch(out, 2)
  deadline = time.time() + 240
  while time.time() < deadline and not (path.exists() and len(results.load_rows(path)) >= 2):
    time.sleep(0.05)
  procs[1].send_signal(signal.SIGKILL)
  procs[1].wait()
  procs[0].kill()  # its shutdown barrier would wait for the dead process
  procs[0].wait()
  before = results.load_rows(path)
  assert 2 <= len(before) < 16, "killed mid-way"
  codes, errs = _wait(_launch(out, 2))
  assert codes == [0, 0], errs
  after = results.load_rows(path)
  assert after[: len(before)] == before  # finished cells kept, not redone
  assert len(after) == 16 and _stable(after) == _stable(single)


def test_more_processes_than_cell_groups_is_one_line_before_loading(tmp_path):
  codes, errs = _wait(_launch(tmp_path / "run", 5))
  assert all(c == 1 for c in codes)
  for e in errs:  # one line each (absl may log around it), no traceback
    assert "sweep: --num_processes=5: more processes than the sweep's 4 groups" in e, e[-2000:]
    assert "Traceback" not in e
  assert not (tmp_path / "run").exists()


def test_a_process_that_joins_with_another_config_stops_both_before_loading(tmp_path):
  """Two real jax.distributed processes, the second with another max_new_tokens: each exits 1
  with the one-line refusal, before anything loads (no config.json, no cells' progress bar)."""
  codes, errs = _wait(_launch(tmp_path / "run", 2, last=["--config.max_new_tokens=9"]), 120)
  assert codes == [1, 1], errs
  for e in errs:
    assert "sweep: process(es) [1] run a different config or checkpoints than process 0" in e, e
    assert "Traceback" not in e and not re.search(r"\d+/\d+ cells", e), e[-2000:]
  assert not (tmp_path / "run").exists()
