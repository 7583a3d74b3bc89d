"""The notebooks run where Jupyter starts them (notebooks/) on a real sweep, and stop at their
first cell with the path and the command to run when there is nothing to read."""

import os
from pathlib import Path

import nbclient
import nbformat
import numpy as np
import pytest

from configs import default
from specdec import metrics
from specdec.lab import driver, results
from tests.helpers import GOLDEN

ROOT = Path(__file__).resolve().parents[2]
TARGET = os.path.join(GOLDEN, "qwen3_gqa")
NAMES = ("acceptance_curves", "draft_budget")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
  """results.jsonl of a small sweep over k and two context lengths."""
  c = default.get_config()
  c.update(dict(target=TARGET, methods=("null", "ngram"), ks=(1, 3), prompt_tokens=(64, 128)))
  c.update(dict(n_prompts=2, max_new_tokens=8))
  out = tmp_path_factory.mktemp("nb_sweep")
  driver.run(c, str(out), progress=False)
  return out / results.RESULTS_NAME


def _notebook(name: str) -> nbformat.NotebookNode:
  nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
  assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # stripped in git
  return nb


def _execute(nb: nbformat.NotebookNode, results_path, monkeypatch) -> nbformat.NotebookNode:
  """The notebook executed in place with its working directory notebooks/, as Jupyter runs it."""
  monkeypatch.setenv("SPECDEC_RESULTS", str(results_path))
  meta = {"metadata": {"path": str(ROOT / "notebooks")}}
  nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources=meta).execute()
  return nb


def _outputs(nb, kind: str) -> list:
  return [
    o["data"][kind] for c in nb.cells for o in c.get("outputs", []) if kind in o.get("data", {})
  ]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_from_notebooks_dir(sweep, monkeypatch, name):
  # A relative $SPECDEC_RESULTS is taken from the repository root, not from notebooks/.
  nb = _execute(_notebook(name), os.path.relpath(sweep, ROOT), monkeypatch)
  pngs, markdown = _outputs(nb, "image/png"), "\n".join(_outputs(nb, "text/markdown"))
  assert len(pngs) == {"acceptance_curves": 1, "draft_budget": 2}[name]  # + tau vs context
  if name == "draft_budget":
    assert "### Context length" in markdown
    return
  # tau by context bucket: each cell's pooled counts through metrics, as the notebook shows them.
  rows = [r for r in results.load_rows(sweep) if r["k"] > 0]
  labels = metrics.bucket_labels([np.inf if e is None else e for e in rows[0]["ctx_edges"]])
  reached = [
    i for i in range(len(labels)) if any(r["accept_hist"][i] != [0] * (r["k"] + 1) for r in rows)
  ]
  assert reached
  assert (
    "| method | k | prompt_tokens | " + " | ".join(labels[i] for i in reached) + " |" in markdown
  )
  for k, ctx in ((1, 64), (3, 128)):
    runs = [r for r in rows if (r["k"], r["prompt_tokens"]) == (k, ctx)]
    hist = metrics.merge_hists([r["accept_hist"] for r in runs])
    emitted = metrics.merge_hists([r["emitted_by_bucket"] for r in runs])
    steps = [metrics.n_steps(hist[i]) for i in reached]
    taus = [
      f"{metrics.tau(float(emitted[i]), n):.2f} ({n})" for i, n in zip(reached, steps, strict=True)
    ]
    assert f"| ngram | {k} | {ctx} | " + " | ".join(taus) + " |" in markdown


@pytest.mark.parametrize("name, empty", [("acceptance_curves", False), ("draft_budget", True)])
def test_nothing_to_read_stops_the_first_cell_with_path_and_command(
  tmp_path, monkeypatch, name, empty
):
  path = tmp_path / "results.jsonl"
  if empty:
    path.write_text("")
  nb = _notebook(name)
  with pytest.raises(nbclient.exceptions.CellExecutionError) as e:
    _execute(nb, path, monkeypatch)
  message = str(e.value)
  assert "FileNotFoundError" in message and str(path) in message
  assert ("holds no result rows" if empty else "does not exist") in message
  assert "./dev sweep" in message and "python -m experiments.sweep --out=" in message
  # The first code cell (the one that reads the file) is where it stopped.
  first, *rest = [c for c in nb.cells if c.cell_type == "code"]
  assert [o.get("ename") for o in first.outputs] == ["FileNotFoundError"]
  assert not any(c.get("execution_count") for c in rest)
