"""A results file -> one layout's Markdown table, its LaTeX, and its plot."""

from pathlib import Path

from specdec.lab import plots, results, tables


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
