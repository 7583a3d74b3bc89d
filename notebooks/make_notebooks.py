"""Writes the notebooks with outputs stripped: `python notebooks/make_notebooks.py`.

Both read a sweep's results file named by $SPECDEC_RESULTS (default: runs/default/results.jsonl).
"""

from pathlib import Path

import nbformat

SETUP = """import os
import numpy as np
from matplotlib.figure import Figure
from IPython.display import Image, Markdown, display
from specdec.lab import results, tables

RESULTS = os.environ.get("SPECDEC_RESULTS", "runs/default/results.jsonl")
rows = results.load_rows(RESULTS)


def show(fig):
    # Figures are built without pyplot, so render them to PNG explicitly.
    import io
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    display(Image(buf.getvalue()))


cells = tables.aggregate(rows)
print(f"{len(rows)} rows, {len(cells)} cells from {RESULTS}")"""

ACCEPTANCE = [
  "# Acceptance curves\n\nPer-position acceptance (unconditional: first i+1 drafts all accepted; "
  "conditional: position i accepted given all before it) for every drafted cell, and tau by "
  "context bucket. All of it is derived from the stored accepted-count histograms.",
  SETUP,
  """series = tables.per_position_series(cells)
fig = Figure(figsize=(10, 4))
ax_u, ax_c = fig.subplots(1, 2, sharey=True)
for label, (uncond, cond) in series.items():
    pos = np.arange(1, len(uncond) + 1)
    ax_u.plot(pos, uncond, marker="o", label=label)
    ax_c.plot(pos, cond, marker="o", label=label)
ax_u.set(title="unconditional", xlabel="draft position", ylabel="acceptance")
ax_c.set(title="conditional", xlabel="draft position")
ax_c.legend(fontsize=6)
show(fig)""",
  """display(Markdown(tables.to_markdown(tables.build(rows, "per_position"))))""",
]

BUDGET = [
  "# Draft budget\n\ntau and decode tok/s against k for each method, with the knee marked "
  "(the first k after which an extra draft token adds less than 0.1 tau).",
  SETUP,
  """from specdec import metrics
series = tables.tau_vs_k_series(cells)
fig = Figure(figsize=(10, 4))
ax_t, ax_s = fig.subplots(1, 2)
for label, s in series.items():
    ax_t.plot(s["k"], s["tau"], marker="o", label=label)
    ax_s.plot(s["k"], s["decode_tok_s"], marker="o", label=label)
    if len(s["k"]) > 1:
        knee = metrics.tau_knee(s["k"], s["tau"])
        ax_t.axvline(knee, ls=":", lw=0.8)
ax_t.set(xlabel="k (draft budget)", ylabel="tau")
ax_s.set(xlabel="k (draft budget)", ylabel="decode tok/s")
ax_t.legend(fontsize=6)
show(fig)""",
  """display(Markdown(tables.to_markdown(tables.build(rows, "draft_budget"))))""",
]


def notebook(cells):
  nb = nbformat.v4.new_notebook()
  for src in cells:
    make = nbformat.v4.new_markdown_cell if src.startswith("#") else nbformat.v4.new_code_cell
    nb.cells.append(make(src))
  nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
  return nb


def main():
  here = Path(__file__).parent
  nbformat.write(notebook(ACCEPTANCE), here / "acceptance_curves.ipynb")
  nbformat.write(notebook(BUDGET), here / "draft_budget.ipynb")


if __name__ == "__main__":
  main()
