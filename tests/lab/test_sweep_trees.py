"""Static draft trees as values of the sweep's axes: rows, the gate, the table beside the chains,
resume, and refusal of bad specs and of methods that cannot draft trees."""

import subprocess
import sys

import pytest

import specdec
from configs import trees as trees_config
from specdec.drafters import save_block
from specdec.drafters.block import block
from specdec.lab import driver, plots, report, results, sweep, tables, trees
from specdec.lab.sweep import SweepError
from tests.lab.test_sweep import FLAGS, TARGET, small_config

# wide3 has depth 1, as the chain k=1 beside it: the cell key must tell them apart.
TREE_SWEEP = dict(ks=(1,), trees=("wide3",))


def _key(r):
  return (r["method"], r["k"], r.get("tree"), r["leg"])


@pytest.fixture(scope="module")
def tree_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("trees") / "run"
  md = driver.run(small_config(**TREE_SWEEP), str(out), progress=False)
  return out, md


def test_tree_and_chain_rows_pass_the_gate_with_their_verify_width(tree_run):
  out, _ = tree_run
  rows = results.load_rows(out / "results.jsonl")
  assert {_key(r) for r in rows} == {
    (m, k, t, leg) for m, k, t in (("null", 0, None), ("ngram", 1, None), ("ngram", 1, "wide3"))
    for leg in (0, 1)
  }  # fmt: skip
  assert all(r["gate_passed"] and r["gate"] != "baseline" for r in rows if r["method"] != "null")
  tree_rows = [r for r in rows if r["tree"] == "wide3"]
  assert all(r["tree_paths"] == [[0], [1], [2]] and r["verify_width"] == 4 for r in tree_rows)
  chain = [r for r in rows if r["method"] == "ngram" and r["tree"] is None]
  assert all(r["tree_paths"] is None and r["verify_width"] == 2 for r in chain)
  assert all(1 <= r["tau"] <= r["k"] + 1 for r in tree_rows)  # tau: emitted tokens per step


def test_the_table_shows_trees_beside_chains_and_experiments_table_prints_them(tree_run):
  out, md = tree_run
  assert "| k | verify width | τ | acceptance | decode tok/s | speedup |" in md
  assert "| 1 | 2 |" in md and "| wide3 (tree, depth 1) | 4 |" in md
  assert md.index("| 1 | 2 |") < md.index("| wide3 (tree, depth 1) |")  # a tree after its chain
  assert tables.TREE_NOTE in md
  p = subprocess.run(
    [sys.executable, "-m", "experiments.table", f"--results={out}/results.jsonl"],
    capture_output=True, text=True,
  )  # fmt: skip
  assert p.returncode == 0, p.stderr
  assert "| wide3 (tree, depth 1) | 4 |" in p.stdout
  for layout in ("per_position", "context"):  # the other layouts take tree cells too
    text, written = report.run(out / "results.jsonl", layout)
    assert "wide3" in text and all(p.stat().st_size > 0 for p in written)


def test_the_k_plot_leaves_trees_out_and_says_so(tree_run):
  out, _ = tree_run
  cells = tables.aggregate(results.load_rows(out / "results.jsonl"))
  series = tables.tau_vs_k_series(cells)
  assert not any("wide3" in label for label in series)
  fig = plots.tau_vs_k_figure(series, trees_left_out=True)
  assert plots.TREES_LEFT_OUT in fig._suptitle.get_text()


def test_resume_runs_the_missing_chain_and_keeps_the_finished_tree_of_the_same_depth(
  tree_run, tmp_path
):
  src, _ = tree_run
  out = tmp_path / "run"
  out.mkdir()
  (out / "config.json").write_bytes((src / "config.json").read_bytes())
  rows = results.load_rows(src / "results.jsonl")
  kept = [r for r in rows if r["leg"] == 0 and r["tree"] == "wide3" or r["method"] == "null"]
  for r in kept:
    results.append_row(out / "results.jsonl", r)
  driver.run(small_config(**TREE_SWEEP), str(out), progress=False)
  after = results.load_rows(out / "results.jsonl")
  assert after[: len(kept)] == kept  # the finished tree (and baselines) not rerun
  assert len(after) == len(rows) and {_key(r) for r in after} == {_key(r) for r in rows}
  assert sum(r["tree"] is None and r["method"] == "ngram" for r in after) == 2


@pytest.mark.parametrize(
  "spec, fragment",
  [
    ("binary9", "config.trees: 'binary9': unknown tree 'binary9'; a tree is a preset"),
    (((0,), (0, 1)), r"config.trees: .*: tree: path \(0, 1\) has no sibling \(0, 0\)"),
    (((0,), (2, 0)), r"tree: path \(2, 0\) has no parent \(2,\)"),
    ((0, 1), "tree: path 0 is not a tuple of integer child ranks"),
    ((), r"config.trees: \(\): \(\) is not a tree"),
  ],
)
def test_bad_tree_specs_are_refused_before_any_model_loads(tmp_path, spec, fragment):
  cfg = small_config(target=str(tmp_path / "no-such-model"), trees=(spec,))
  with pytest.raises(SweepError, match=fragment):  # before the missing target is looked for
    driver.run(cfg, str(tmp_path / "run"), progress=False)
  assert not (tmp_path / "run").exists()


def test_a_bad_tree_flag_is_one_line_from_the_cli(tmp_path):
  cmd = [sys.executable, "-m", "experiments.sweep", *FLAGS, "--config.trees=wide3,nosuch"]
  p = subprocess.run([*cmd, f"--out={tmp_path}/run"], capture_output=True, text=True)
  assert p.returncode == 1
  last = p.stderr.strip().splitlines()[-1]
  assert last.startswith("sweep: config.trees: 'nosuch': unknown tree 'nosuch'"), p.stderr


def test_a_method_that_cannot_draft_trees_is_refused_by_name(tmp_path):
  # A block drafter (DFlash) for the test target, saved where config.checkpoints names it.
  target = specdec.load(TARGET)
  d = block(target, num_layers=1, block_size=4, target_layer_ids=(0, 1))
  save_block(str(tmp_path / "block8"), d.cfg, d.draft_params)
  cfg = small_config(methods=("null", "ngram", "block8"), **TREE_SWEEP)
  cfg.checkpoints.block8 = str(tmp_path / "block8")
  with pytest.raises(SweepError, match="cell block8 tree=wide3 .*cannot draft trees"):
    driver.run(cfg, str(tmp_path / "run"), progress=False)
  assert not (tmp_path / "run" / "results.jsonl").exists()


def test_suffix_runs_tree_cells_and_passes_the_gate(tmp_path):
  out = tmp_path / "run"
  driver.run(small_config(methods=("null", "suffix"), **TREE_SWEEP), str(out), progress=False)
  rows = [r for r in results.load_rows(out / "results.jsonl") if r["method"] == "suffix"]
  assert {(r["k"], r["tree"], r["leg"]) for r in rows} == {
    (1, t, leg) for t in (None, "wide3") for leg in (0, 1)
  }
  assert all(r["gate_passed"] and r["gate"] != "baseline" for r in rows)
  assert all(r["verify_width"] == 4 for r in rows if r["tree"] == "wide3")


def test_tree_cells_follow_the_chains_and_explicit_paths_name_their_shape():
  cfg = sweep.normalize(small_config(ks=(1, 3), trees=("binary2, wide3", ((0,), (0, 0)))))
  drafted = [(c.k, c.tree) for c in sweep.expand(cfg) if c.method == "ngram"]
  assert drafted == [(1, None), (3, None), (2, "binary2"), (1, "wide3"), (2, "[[0],[0,0]]")]
  assert trees.resolve("[[0],[0,0]]")[1] == trees.resolve(((0,), (0, 0)))[1]
  assert trees.resolve(((1,), (0,), (2,)))[0] == "wide3"  # a preset's paths take its name
  null = [c for c in sweep.expand(cfg) if c.method == "null"]
  assert [c.tree for c in null] == [None] and null[0].k == 0


def test_the_trees_config_matches_each_tree_to_a_chain_of_its_verify_width():
  cfg = trees_config.get_config()
  assert {"ngram", "draft_lm", "mtp", "eagle3"} <= set(cfg.methods)
  assert "auto" in cfg.trees and "auto" in cfg.ks  # each auto beside the other
  for spec in (t for t in cfg.trees if t != "auto"):
    assert trees.resolve(spec)[1].size - 1 in cfg.ks, spec
