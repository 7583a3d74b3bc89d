"""A method that drafts for another target than config.target (config.per_method): its cells, that
target's no-draft arm beside it, rows and tables that name the target, and the refusals."""

import json
import os

import pytest

from specdec.lab import driver, results, sweep
from specdec.lab.sweep import SweepError
from tests.lab.test_sweep import TARGET, small_config

# A Qwen3-Next target whose checkpoint also holds its MTP head (`mtp.*`), as the family ships it.
HYBRID = "tests/fixtures/hybrid/qwen3_next_mtp"


def two_targets(**kw):
  c = small_config(methods=("null", "ngram", "hybrid_mtp"), ks=(2,), max_new_tokens=8)
  c.update(dict(workloads=("jax_source",), prompt_tokens=(48, 64)))
  c.checkpoints.hybrid_mtp = HYBRID
  c.per_method = {"hybrid_mtp": {"target": HYBRID, "ks": (1, 3), "prompt_tokens": (64,)}}
  c.update(kw)
  return c


def test_a_per_method_target_gets_its_own_no_draft_arm_at_the_method_s_lengths():
  cfg = sweep.normalize(two_targets())
  assert sweep.targets(cfg) == [TARGET, HYBRID]
  cells = {(c.target, c.method, c.k, c.prompt_tokens) for c in sweep.expand(cfg)}
  assert cells == {
    *((TARGET, "null", 0, n) for n in (48, 64)),
    *((TARGET, "ngram", 2, n) for n in (48, 64)),
    (HYBRID, "null", 0, 64),
    (HYBRID, "hybrid_mtp", 1, 64),
    (HYBRID, "hybrid_mtp", 3, 64),
  }
  assert sweep.target_config(cfg, HYBRID).methods == ("null", "hybrid_mtp")
  assert sweep.targets(sweep.normalize(two_targets(methods=("null", "ngram")))) == [TARGET]


@pytest.mark.parametrize(
  "per_method, fragment",
  [
    ({"null": {"ks": (2,)}}, "config.per_method.null: the no-draft arm runs on every target"),
    ({"hybrid_mpt": {"ks": (2,)}}, "config.per_method.hybrid_mpt: unknown method"),
    ({"hybrid_mtp": {"k": (2,)}}, "unknown setting(s) k; a method may set target, ks, prompt"),
    ({"hybrid_mtp": {"target": HYBRID, "ks": ()}}, "config.per_method.hybrid_mtp.ks is empty"),
    ({"hybrid_mtp": {"target": "zoo:nothing"}}, "--models=nothing"),
  ],
)
def test_bad_per_method_settings_are_refused_by_name(tmp_path, per_method, fragment):
  with pytest.raises(SweepError) as e:
    driver.run(two_targets(per_method=per_method), str(tmp_path / "run"), progress=False)
  assert fragment in str(e.value), str(e.value)
  assert not (tmp_path / "run").exists()


def test_each_target_runs_its_cells_with_its_gate_and_the_table_names_it(tmp_path):
  out = str(tmp_path / "run")
  md = driver.run(two_targets(), out, progress=False)
  rows = results.load_rows(os.path.join(out, "results.jsonl"))
  assert len(rows) == 2 * 7  # 7 cells, 2 legs
  assert all(r["gate_passed"] for r in rows)
  hybrid = [r for r in rows if r["target"] == HYBRID]
  assert {(r["method"], r["k"]) for r in hybrid} == {
    ("null", 0),
    ("hybrid_mtp", 1),
    ("hybrid_mtp", 3),
  }
  assert all(r["drafter"] == HYBRID for r in hybrid if r["method"] == "hybrid_mtp")
  assert all(r["proposed"] > 0 for r in hybrid if r["method"] == "hybrid_mtp")
  assert f"method=hybrid_mtp, prompt=64, target={HYBRID}" in md
  with open(os.path.join(out, "config.json")) as f:
    assert "per_method.hybrid_mtp.target" in json.load(f)["checkpoint_fingerprints"]
  driver.run(two_targets(), out, progress=False)  # resumed: every (cell, leg) is done
  assert len(results.load_rows(os.path.join(out, "results.jsonl"))) == len(rows)
