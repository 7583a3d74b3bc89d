"""Print a paper-style table of a sweep and write its LaTeX and plots.

  python -m experiments.table --results=DIR/results.jsonl --layout=draft_budget [--out=DIR]

Markdown goes to stdout; OUT/table_<layout>.tex and the layout's PNG (if it has one) are written,
OUT defaulting to the results file's directory.
"""

from pathlib import Path

from absl import app, flags

from specdec import plots, results, tables

_RESULTS = flags.DEFINE_string("results", None, "path of a sweep's results.jsonl", required=True)
_LAYOUT = flags.DEFINE_enum("layout", "draft_budget", tables.LAYOUTS, "table layout")
_OUT = flags.DEFINE_string("out", None, "where .tex and .png go; default: beside --results")
_BASELINE = flags.DEFINE_string("baseline", tables.DEFAULT_BASELINE, "method speedups divide by")
_KNEE = flags.DEFINE_float("knee_threshold", 0.1, "tau gain per extra draft token below = knee")


def run(
  results_path: str | Path,
  layout: str,
  out_dir: str | Path | None = None,
  baseline: str = tables.DEFAULT_BASELINE,
  knee_threshold: float = 0.1,
) -> tuple[str, list[Path]]:
  """(markdown, written files) for one layout of one results file."""
  rows = results.load_rows(results_path)
  out = results.prepare_out_dir(out_dir or Path(results_path).parent)
  table = tables.build(rows, layout, baseline, knee_threshold)
  tex = out / f"table_{layout}.tex"
  tex.write_text(tables.to_latex(table), encoding="utf-8")
  written = [tex]
  cells = tables.aggregate(rows)
  if layout == "per_position":
    written.append(plots.per_position(tables.per_position_series(cells), out / "per_position.png"))
  elif layout == "draft_budget":
    written.append(
      plots.tau_vs_k(tables.tau_vs_k_series(cells), out / "tau_vs_k.png", knee_threshold)
    )
  elif layout == "context":
    written.append(
      plots.tau_vs_context(tables.tau_vs_context_series(cells), out / "tau_vs_ctx.png")
    )
  return tables.to_markdown(table), written


def main(argv):
  del argv
  markdown, written = run(_RESULTS.value, _LAYOUT.value, _OUT.value, _BASELINE.value, _KNEE.value)
  print(markdown)
  for path in written:
    print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
