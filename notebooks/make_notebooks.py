"""Writes the notebooks with outputs stripped: `python notebooks/make_notebooks.py`.

Both read a sweep's results file: $SPECDEC_RESULTS, else runs/default/results.jsonl (what
`./dev sweep` writes), a relative path taken from the repository root whatever directory Jupyter
started in. The first cell that reads it stops with the path and the command that makes it when
the file is missing or holds no rows. Plots are specdec.lab.plots' own figures, as the sweep writes
them.
"""

from pathlib import Path

import nbformat

SETUP = '''import os
from pathlib import Path

from IPython.display import Image, Markdown, display

import specdec
from specdec.lab import plots, results, tables


def repo_root() -> Path:
  """The first of the working directory and its parents holding specdec/ and notebooks/ (Jupyter
  starts in notebooks/), else the checkout the imported specdec lives in."""
  for d in (Path.cwd(), *Path.cwd().parents):
    if (d / "specdec").is_dir() and (d / "notebooks").is_dir():
      return d
  return Path(specdec.__file__).resolve().parents[1]


REPO = repo_root()
RESULTS = REPO / os.environ.get("SPECDEC_RESULTS", "runs/default/results.jsonl")
rows = results.load_rows(RESULTS)
if not rows:
  state = "holds no result rows" if RESULTS.exists() else "does not exist"
  raise FileNotFoundError(
    f"{RESULTS} {state}. Make it with `./dev sweep` (writes runs/default/results.jsonl), or with "
    "`python -m experiments.sweep --out=DIR` and set SPECDEC_RESULTS=DIR/results.jsonl."
  )
cells = tables.aggregate(rows)
print(f"{len(rows)} rows, {len(cells)} cells from {RESULTS}")'''

ACCEPTANCE = [
  "# Acceptance curves\n\nPer-position acceptance for every drafted cell, one panel per method, "
  "colour by k: unconditional (solid: the first i drafts all accepted) and conditional (dashed: "
  "draft i accepted given all before it), then tau by context bucket. All of it is derived from "
  "the stored accepted-count histograms (specdec/metrics.py).",
  SETUP,
  """display(Image(plots.png(plots.per_position_figure(tables.per_position_series(cells)))))""",
  """display(Markdown(tables.to_markdown(tables.build(rows, "per_position"))))""",
  "## tau by context bucket\n\nEach verify step is counted in the bucket of the context it "
  "drafted from (`ctx_edges`). Per drafted cell, its runs' `accept_hist` [bucket][accepted] and "
  "`emitted_by_bucket` are summed and tau = emitted / steps in each bucket (`metrics.tau`); the "
  "step count follows in brackets. Buckets no step reached are left out.",
  '''import math

from specdec import metrics


def edges(row):
  return [math.inf if e is None else e for e in row["ctx_edges"]]


def bucket_taus(runs):
  """{bucket label: (tau, steps)} over the buckets a cell's runs reached."""
  hist = metrics.merge_hists([r["accept_hist"] for r in runs])
  emitted = metrics.merge_hists([r["emitted_by_bucket"] for r in runs])
  steps = [metrics.n_steps(h) for h in hist]
  return {
    label: (metrics.tau(float(e), s), s)
    for label, s, e in zip(metrics.bucket_labels(edges(runs[0])), steps, emitted, strict=True)
    if s
  }


# A cell's runs keyed (sample seed, leg): a run written twice counts once, as in tables.aggregate.
by_cell = {}
for r in rows:
  if r["k"] > 0 and r.get("accept_hist"):
    key = tuple(r.get(f) for f in tables.AGG_FIELDS)
    by_cell.setdefault(key, {})[(r.get("sample_seed"), r.get("leg"))] = r
taus = {key: bucket_taus(list(runs.values())) for key, runs in by_cell.items()}
shown = [
  i
  for i, f in enumerate(tables.AGG_FIELDS)
  if f in ("method", "k") or len({key[i] for key in taus}) > 1
]
every = metrics.bucket_labels(edges(rows[0]))
buckets = [label for label in every if any(label in t for t in taus.values())]
lines = [
  "| " + " | ".join([tables.AGG_FIELDS[i] for i in shown] + buckets) + " |",
  "|" + "---|" * len(shown) + "---:|" * len(buckets),
]
for key, t in taus.items():
  values = [f"{t[b][0]:.2f} ({t[b][1]})" if b in t else "—" for b in buckets]
  lines.append("| " + " | ".join([str(key[i]) for i in shown] + values) + " |")
display(Markdown("\\n".join(lines) if taus else "No drafted cell kept its histograms."))''',
]

BUDGET = [
  "# Draft budget\n\ntau and decode tok/s against k, a colour per method, with the knee marked "
  "(★: the first k after which an extra draft token adds less than 0.1 tau) and the fastest k "
  "(□); the no-draft arm is the dotted line. A sweep over context lengths gets a row per length.",
  SETUP,
  """display(Image(plots.png(plots.tau_vs_k_figure(tables.tau_vs_k_series(cells)))))""",
  """display(Markdown(tables.to_markdown(tables.build(rows, "draft_budget"))))""",
  "## tau vs context length\n\nWhen the sweep varies the prompt length: tau against it, one "
  "panel per method, colour by k.",
  """if len({c.conditions["prompt_tokens"] for c in cells}) > 1:
  display(Image(plots.png(plots.tau_vs_context_figure(tables.tau_vs_context_series(cells)))))
  display(Markdown(tables.to_markdown(tables.build(rows, "context"))))
else:
  print("one prompt length in this sweep: no context axis to plot")""",
]


def notebook(cells):
  nb = nbformat.v4.new_notebook()
  for i, src in enumerate(cells):
    make = nbformat.v4.new_markdown_cell if src.startswith("#") else nbformat.v4.new_code_cell
    nb.cells.append(make(src, id=f"cell-{i}"))  # fixed ids: regenerating changes nothing
  nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
  return nb


def main():
  here = Path(__file__).parent
  nbformat.write(notebook(ACCEPTANCE), here / "acceptance_curves.ipynb")
  nbformat.write(notebook(BUDGET), here / "draft_budget.ipynb")


if __name__ == "__main__":
  main()
