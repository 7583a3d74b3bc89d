"""Results files -> one layout's Markdown table, its LaTeX, and its plot."""

from collections.abc import Sequence
from pathlib import Path

from specdec.lab import plots, results, tables


def run(
  results_path: str | Path | Sequence[str | Path],
  layout: str,
  out_dir: str | Path | None = None,
  baseline: str = tables.DEFAULT_BASELINE,
  knee_threshold: float = 0.1,
) -> tuple[str, list[Path]]:
  """(markdown, written files) for one layout of the rows of one results file or several (one
  table over all of them: sweeps of other workloads, say); out_dir defaults to the first's."""
  paths = [results_path] if isinstance(results_path, str | Path) else list(results_path)
  rows = [row for path in paths for row in results.load_rows(path)]
  out = results.prepare_out_dir(out_dir or Path(paths[0]).parent)
  table = tables.build(rows, layout, baseline, knee_threshold)
  tex = out / f"table_{layout}.tex"
  tex.write_text(tables.to_latex(table), encoding="utf-8")
  written = [tex]
  cells = tables.aggregate(rows)
  if layout == "per_position":
    written.append(plots.per_position(tables.per_position_series(cells), out / "per_position.png"))
  elif layout == "draft_budget":
    trees = any(c.tree is not None for c in cells)
    series = tables.tau_vs_k_series(cells)
    written.append(plots.tau_vs_k(series, out / "tau_vs_k.png", knee_threshold, trees))
    chosen = tables.chosen_k_series(rows)
    if chosen:
      written.append(plots.chosen_k(chosen, out / "chosen_k.png"))
  elif layout == "context":
    written.append(
      plots.tau_vs_context(tables.tau_vs_context_series(cells), out / "tau_vs_ctx.png")
    )
  return tables.to_markdown(table), written
