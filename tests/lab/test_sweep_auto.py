"""k="auto" as a value of the sweep's k axis: rows, the table beside fixed k, the chosen-k plot."""

import os

import pytest

from specdec.decoding import step_costs
from specdec.lab import driver, report, results, tables
from specdec.lab.sweep import SweepError
from tests.helpers import result_row as make_row
from tests.lab.test_sweep import small_config


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("auto")
  mp = pytest.MonkeyPatch()
  mp.setenv(step_costs.COST_CACHE_ENV, str(out / "costs"))  # the measured curve stays in the test
  try:
    md = driver.run(small_config(ks=(1, "auto"), budget_tiers=(1, 2)), str(out / "run"))
  finally:
    mp.undo()
  return out / "run", md


def test_auto_rows_pass_the_gate_and_count_their_tiers(auto_run):
  out, _ = auto_run
  rows = [r for r in results.load_rows(out / "results.jsonl") if r["k"] == "auto"]
  assert len(rows) == 2  # one per leg
  for r in rows:
    assert r["gate_passed"] and r["tiers"] == [1, 2]
    assert sum(r["tier_hist"]) == r["steps"]
    assert r["proposed"] == r["tier_hist"][0] + 2 * r["tier_hist"][1]
    assert 1.0 <= r["tau"] <= 3.0
    assert r["position_accepted"][1] <= r["position_reached"][1] <= r["position_offered"][1]
    traces = [c["k_trace"] for c in r["extra"]["calls"]]
    assert all(set(t) <= {1, 2} for t in traces) and sum(len(t) for t in traces) > 0


def test_the_table_prints_auto_beside_fixed_k_and_the_plot_is_written(auto_run):
  out, md = auto_run
  assert "| auto |" in md.replace("  ", " ") or "| auto " in md
  assert "k=auto ran k=1" in md and "the fastest fixed k=1" in md
  text, written = report.run(out / "results.jsonl", "draft_budget")
  assert any(p.name == "chosen_k.png" and p.stat().st_size > 0 for p in written), written
  series = tables.chosen_k_series(results.load_rows(out / "results.jsonl"))
  ((label, s),) = series.items()
  assert "ngram" in label and s["tiers"] == [1, 2] and set(s["k"]) <= {1, 2}


def test_bad_auto_configs_are_refused_before_running(tmp_path):
  with pytest.raises(SweepError, match="config.budget_tiers: budget tiers must be strictly"):
    driver.run(small_config(ks=("auto",), budget_tiers=(2, 1)), str(tmp_path / "a"))
  with pytest.raises(SweepError, match="config.ks: k='four' must be an integer >= 1 or 'auto'"):
    driver.run(small_config(ks=("four",)), str(tmp_path / "b"))
  assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


def test_a_row_takes_k_auto_and_refuses_another_string():
  results.validate_row(make_row(k="auto", tiers=[1, 2], tier_hist=[3, 4]))
  with pytest.raises(results.ResultsError, match="k should be int or 'auto', got str 'four'"):
    results.validate_row(make_row(k="four"))


def test_tree_auto_is_a_value_of_the_trees_axis(tmp_path, monkeypatch):
  monkeypatch.setenv(step_costs.COST_CACHE_ENV, str(tmp_path / "costs"))
  tiers = (((0,),), ((0,), (1,)))
  cfg = small_config(ks=(1,), trees=("auto",), budget_tree_tiers=tiers)
  md = driver.run(cfg, str(tmp_path / "run"), progress=False)
  rows = [r for r in results.load_rows(tmp_path / "run" / "results.jsonl") if r["k"] == "auto"]
  assert len(rows) == 2 and all(r["tree"] == "auto" for r in rows)
  for r in rows:
    assert r["gate_passed"] and r["tiers"] == [1, 2] and sum(r["tier_hist"]) == r["steps"]
    assert r["tree_paths"] is None and r["tier_trees"] == [[[0]], [[0], [1]]]
  assert "auto (trees)" in md and "tree=auto ran 1-node tree" in md
  with pytest.raises(
    SweepError, match="config.budget_tree_tiers: budget tiers\\[0\\] is not nested"
  ):
    bad_tiers = (((0,), (1,)), ((0,), (0, 0)))
    bad = small_config(ks=(1,), trees=("auto",), budget_tree_tiers=bad_tiers)
    driver.run(bad, str(tmp_path / "bad"))
  assert not (tmp_path / "bad").exists()
