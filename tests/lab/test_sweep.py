"""The sweep: rows, gate, resume (also after SIGKILL), and refusal of impossible configs."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from configs import default
from specdec.lab import driver, results, sweep
from specdec.lab.sweep import SweepError
from tests.helpers import GOLDEN

TARGET = os.path.join(GOLDEN, "qwen3_gqa")
FLAGS = [
  f"--config.target={TARGET}",
  f"--config.checkpoints.draft_lm={TARGET}",
  "--config.methods=null,ngram",
  "--config.ks=(1,2,3)",
  "--config.n_prompts=2",
  "--config.max_new_tokens=8",
  "--config.workloads=humaneval",
  "--config.prompt_tokens=(0,)",
]


def small_config(**kw):
  c = default.get_config()
  c.update(dict(target=TARGET, methods=("null", "ngram"), ks=(1, 3)))
  c.checkpoints.draft_lm = TARGET
  c.update(dict(n_prompts=2, max_new_tokens=8, workloads=("humaneval",), prompt_tokens=(0,)))
  c.update(kw)
  return c


def _rows(out):
  return results.load_rows(os.path.join(out, "results.jsonl"))


def test_sweep_writes_a_row_per_cell_and_leg_and_resumes(tmp_path):
  out = str(tmp_path / "run")
  md = driver.run(small_config(), out, progress=False)
  rows = _rows(out)
  assert len(rows) == 3 * 2  # (null, ngram k=1, ngram k=3) x 2 legs
  assert {(r["method"], r["k"], r["leg"]) for r in rows} == {
    (m, k, leg) for m, k in (("null", 0), ("ngram", 1), ("ngram", 3)) for leg in (0, 1)
  }
  assert all(r["gate_passed"] for r in rows)
  assert all(1 <= r["tau"] <= r["k"] + 1 for r in rows)
  assert all(r["n_requests_timed"] == 1 for r in rows)  # request 0 discarded
  assert "| k | τ |" in md
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["ks"] == [1, 3]
  # The same --out again: every (cell, leg) is finished, nothing is appended.
  driver.run(small_config(), out, progress=False)
  assert len(_rows(out)) == 6


def test_resume_refuses_a_different_sweep(tmp_path):
  out = str(tmp_path / "run")
  driver.run(small_config(ks=(1,)), out, progress=False)
  with pytest.raises(results.ResultsError, match="ks"):
    driver.run(small_config(ks=(2,)), out, progress=False)


def test_progress_line_counts_cells_and_takes_its_eta_from_measured_cell_times(
  tmp_path, monkeypatch, capsys
):
  """n/total, the cell just measured, and an ETA of (cells left) x (mean measured s/cell), with
  the ahead-of-time compile reported apart. driver's clock is faked: 75 s of compile, then cells
  of 100, 20, 60 and 40 s."""
  from types import SimpleNamespace

  from tqdm import tqdm

  from specdec.progress import BAR_FORMAT

  ticks = iter([0.0, 75.0, 1000.0, 1100.0, 2000.0, 2020.0, 3000.0, 3060.0, 4000.0, 4040.0])
  monkeypatch.setattr(driver, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
  lines = []

  events = []

  class Recording(tqdm):
    def update(self, n=1):
      super().update(n)
      if self.bar_format == BAR_FORMAT:  # the cells' bar, not the compile-ahead ones
        lines.append(str(self))
        events.append("update")

    def set_description(self, desc=None, refresh=True):
      super().set_description(desc, refresh)
      events.append(desc)

  monkeypatch.setattr(driver, "tqdm", Recording)
  run_cell = sweep.Runner.run
  monkeypatch.setattr(sweep.Runner, "run", lambda *a: events.append("run") or run_cell(*a))
  driver.run(small_config(ks=(1,)), str(tmp_path / "run"), progress=True, compile_workers=1)
  assert len(lines) == 4  # (null, ngram k=1) x 2 legs
  # each cell is named while it runs, before its count goes up
  assert events[:3] == ["leg 0 humaneval null k=0 ctx=0 T=0.0", "run", "update"], events
  expect = [
    ("1/4", "leg 0 humaneval null k=0", "ETA 5:00 at 100.00 s/cell"),  # 3 left x 100 s
    ("2/4", "leg 0 humaneval ngram k=1", "ETA 2:00 at 60.00 s/cell"),  # 2 x (100 + 20) / 2
    ("3/4", "leg 1 humaneval null k=0", "ETA 1:00 at 60.00 s/cell"),  # 1 x 180 / 3
    ("4/4", "leg 1 humaneval ngram k=1", "ETA 0:00 at 55.00 s/cell"),
  ]
  for line, (count, cell, eta) in zip(lines, expect, strict=True):
    assert line.startswith(f"{cell} ctx=0 T=0.0: {count} cells"), line
    assert f"{eta} measured on 1 device(s) (compiled ahead in 1:15)" in line, line
  err = capsys.readouterr().err
  assert "4/4 cells" in err and "in 75.0 s on 1 threads; measured in 220.0 s" in err, err
  assert next(ticks, None) is None  # every measured time was read


def test_killed_sweep_loses_at_most_the_cell_in_flight(tmp_path):
  out = str(tmp_path / "run")
  path = os.path.join(out, "results.jsonl")
  cmd = [sys.executable, "-m", "experiments.sweep", *FLAGS, f"--out={out}", "--noplots"]
  # No persistent compilation cache: every cell compiles, so the kill lands mid-sweep.
  env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"}
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
  deadline = time.time() + 240
  while time.time() < deadline and not (os.path.exists(path) and len(_rows(out)) >= 2):
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  before = _rows(out)
  assert 2 <= len(before) < 8, "the sweep should have been killed mid-way"
  subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  after = _rows(out)
  assert after[: len(before)] == before  # finished cells kept, not redone
  assert len(after) == 8 and len({(r["method"], r["k"], r["leg"]) for r in after}) == 8


@pytest.mark.parametrize(
  "kw, fragment",
  [
    (dict(ks=(600,)), "exceeds the cache room of 512 positions"),
    (dict(prompt_tokens=(600,)), "exceeds"),
    (dict(ks=(0,)), "k=0 must be an integer >= 1"),
    (dict(methods=("null", "medusa")), "unknown method 'medusa'"),
    (dict(target_formats=("exl3",)), "target_formats"),
    (dict(legs=1), "legs"),
    (dict(acceptances=("typical",)), "unknown acceptance mode 'typical'"),
    (dict(temperatures=(0.6,), acceptances=("greedy",)), "needs temperature=0"),
    (dict(dtype="float8"), "config.dtype"),
    (dict(memory_fraction=1.5), "config.memory_fraction"),
    (dict(methods=("null", "suffix"), suffix={"store_size": 0}), "config.suffix: .*store_size=0"),
    (dict(methods=("null", "suffix"), suffix={"max_depth": 4096}), "max_depth=4096 exceeds"),
  ],
)
def test_impossible_configs_are_refused_before_running(tmp_path, kw, fragment):
  out = tmp_path / "run"
  with pytest.raises(SweepError, match=fragment):
    driver.run(small_config(**kw), str(out), progress=False)
  assert not (out / "results.jsonl").exists()


def test_unwritable_out_is_refused(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(results.ResultsError, match="not a writable directory"):
    driver.run(small_config(), str(blocker / "run"), progress=False)


def test_unknown_config_field_is_refused(tmp_path):
  cmd = [
    sys.executable,
    "-m",
    "experiments.sweep",
    *FLAGS,
    "--config.nonsense=3",
    f"--out={tmp_path}",
  ]
  r = subprocess.run(cmd, capture_output=True, text=True)
  assert r.returncode != 0 and "nonsense" in r.stderr


def test_corrupt_results_line_is_refused(tmp_path):
  out = tmp_path / "run"
  out.mkdir()
  (out / "results.jsonl").write_text('{"method": "null"}\nnot json\n{"a": 1}\n')
  with pytest.raises(results.ResultsError, match=r"results.jsonl:2: corrupt result row"):
    driver.run(small_config(), str(out), progress=False)


def test_chat_template_when_the_config_asks(tmp_path):
  import shutil

  target = tmp_path / "target"
  shutil.copytree(TARGET, target)
  raw = driver.run(small_config(target=str(target), ks=(1,)), str(tmp_path / "raw"), False)
  assert raw
  with pytest.raises(SweepError, match="tokenizer_config.json holds no chat_template"):
    driver.run(small_config(target=str(target), chat_template=True), str(tmp_path / "x"), False)
  template = "{% for m in messages %}<user>{{ m['content'] }}</user>{% endfor %}<assistant>"
  (target / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
  out = tmp_path / "chat"
  driver.run(small_config(target=str(target), chat_template=True, ks=(1,)), str(out), False)
  chat, plain = _rows(str(out)), _rows(str(tmp_path / "raw"))
  assert all(r["extra"]["chat_template"] for r in chat)
  assert chat[0]["extra"]["prompt_lengths"][0] > plain[0]["extra"]["prompt_lengths"][0]


def _runner_and_cell(temperature: float):
  import specdec
  from specdec.lab import sweep

  cfg = sweep.normalize(small_config(temperatures=(temperature,)))
  cell = next(c for c in sweep.expand(cfg) if c.method == "ngram" and c.k == 3)
  runner = sweep.Runner(cfg, specdec.load(TARGET, dtype=sweep.DTYPES[cfg.dtype]), {})
  return runner, cell


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_gate_falls_back_to_the_same_shape_baseline(monkeypatch, temperature):
  """A no-draft arm that disagrees (as 16-bit width-dependent rounding can make it) sends the gate
  to the same-shape baseline; a drafted output that differs from that baseline too fails it."""
  runner, cell = _runner_and_cell(temperature)
  if temperature:
    monkeypatch.setitem(runner._greedy_ref, (cell.workload, cell.prompt_tokens, 0), [[-1]])
  row = runner.run(cell, 0, baseline_sha="not-the-no-draft-output")
  assert row["gate_passed"] and "same-shape baseline" in row["gate"]

  generate = runner._generate

  def wrong_reject(c, ids, seed, drafter_name=None, temperature=None, acceptance=None):
    g = generate(c, ids, seed, drafter_name, temperature, acceptance)
    if acceptance == "reject":
      return dataclasses.replace(g, tokens=[t[:-1] + [t[-1] + 1] for t in g.tokens])
    return g

  monkeypatch.setattr(runner, "_generate", wrong_reject)
  row = runner.run(cell, 0, baseline_sha="not-the-no-draft-output")
  assert not row["gate_passed"] and "same-shape baseline" in row["gate"]


@pytest.mark.parametrize("fuse", [True, False])
def test_the_decoding_target_has_fused_projections_when_the_config_asks(fuse):
  import specdec
  from specdec.lab import sweep

  cfg = sweep.normalize(small_config(fuse_projections=fuse))
  cell = next(c for c in sweep.expand(cfg) if c.method == "ngram")
  target = specdec.load(TARGET, dtype=sweep.DTYPES[cfg.dtype], fuse_projections=fuse)
  runner = sweep.Runner(cfg, target, {})
  row = runner.run(cell, 0, baseline_sha=None)
  assert runner._targets[cell.target_format] is target  # decoded as loaded: no second copy
  layer = runner._targets[cell.target_format].params["params"]["layer_0"]
  assert ("qkv_proj" in layer["attn"], "gate_up_proj" in layer["mlp"]) == (fuse, fuse)
  assert "q_proj" not in layer["attn"] if fuse else "q_proj" in layer["attn"]
  assert row["extra"]["fuse_projections"] is fuse and row["gate_passed"]


def test_resume_refuses_a_target_whose_files_changed(tmp_path):
  import shutil

  target = tmp_path / "target"
  shutil.copytree(TARGET, target)
  out = str(tmp_path / "run")
  cfg = small_config(target=str(target), ks=(1,))
  cfg.checkpoints.draft_lm = str(target)
  driver.run(cfg, out, progress=False)
  driver.run(cfg, out, progress=False)  # same bytes: a resume
  (target / "generation_config.json").write_text('{"eos_token_id": 0}')
  with pytest.raises(results.ResultsError, match="checkpoint_fingerprints.target"):
    driver.run(cfg, out, progress=False)


def test_bad_input_is_one_line_before_anything_loads_and_leaves_no_directory(tmp_path):
  out = tmp_path / "run"
  for flag, fragment in [
    ("--config.methods=null,nope", "config.methods: unknown method 'nope'"),
    ("--config.checkpoints.mtp=/no/such/dir", "config.checkpoints.mtp='/no/such/dir'"),
    ("--config.ks=(0,)", "config.ks: k=0 must be an integer >= 1"),
  ]:
    p = subprocess.run(
      [sys.executable, "-m", "experiments.sweep", flag, f"--out={out}"],
      capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("sweep:")]
    assert len(lines) == 1 and fragment in lines[0], p.stderr
    assert "Traceback" not in p.stderr
    assert not out.exists()


@pytest.mark.parametrize(
  "method, case, kind",
  [("dspark", "spec_dspark_rnn", "Block"), ("dflash2", "spec_dflash2", "Block"),
   ("eagle3_q", "spec_eagle3_qwen3", "Eagle3"), ("mtp2", "spec_mtp", "MTP")],
)  # fmt: skip
def test_a_method_of_any_name_loads_the_layout_its_checkpoint_holds(method, case, kind):
  from specdec.lab.sweep import load_drafter
  from tests.checkpoint.test_published_drafters import HERE, target_for

  layers = 3 if kind == "Eagle3" else 2
  d = load_drafter(method, os.path.join(HERE, case), target_for(case, layers), "float32")
  assert type(d).__name__ == kind
  with pytest.raises(SweepError, match=f"config.checkpoints.{method}: .*not a checkpoint dir"):
    load_drafter(method, os.path.join(HERE, "missing"), None, "float32")


def test_a_refusal_keeps_its_error_when_another_process_removed_the_directory(
  tmp_path, monkeypatch
):
  out = tmp_path / "run"

  def refuse(cfg, out_dir, *args):  # the other process of the sweep cleaned up first
    out_dir.rmdir()
    raise SweepError("process(es) [1] run a different config")

  monkeypatch.setattr(driver, "_run", refuse)
  with pytest.raises(SweepError, match="different config"):
    driver.run(small_config(), str(out), progress=False)
  assert not out.exists()
