import math

import numpy as np
import pytest

from specdec import metrics
from specdec.lab import report as table_main
from specdec.lab import results, tables
from tests.helpers import result_row


def _row(method, k, hist, tok_s, leg, **over):
  """A result row whose acceptance fields are derived from `hist` as the sweep would."""
  hist = np.asarray(hist)
  row = result_row(
    method=method,
    k=k,
    seed=leg,
    leg=leg,
    accept_hist=hist,
    decode_tok_s=tok_s,
    whole_tok_s=tok_s * 0.9,
    **metrics.hist_summary(hist),
  )
  row.update(over)
  return row


# Known numbers: k=2 hist [2, 3, 5] -> tau 2.3, acceptance 13/20 = 0.65.
HISTS = {1: [[4, 6]], 2: [[2, 3, 5]], 4: [[1, 1, 2, 2, 4]]}
SPEED = {1: 130.0, 2: 150.0, 4: 140.0}


def _draft_budget_rows():
  rows = []
  for leg, base in ((0, 100.0), (1, 104.0)):
    rows.append(_row("null", 0, [[10]], base, leg))
    for k, hist in HISTS.items():
      rows.append(_row("ngram", k, hist, SPEED[k] * base / 100.0, leg))
    rows.append(_row("eagle3", 2, [[0, 2, 8]], 300.0, leg, gate_passed=leg == 0))
  return rows


def _write(tmp_path, rows):
  path = tmp_path / "results.jsonl"
  for r in rows:
    results.append_row(path, r)
  return path


def test_draft_budget_table_text(tmp_path):
  path = _write(tmp_path, _draft_budget_rows())
  md, written = table_main.run(path, "draft_budget")
  assert "| 2 | 2.30 | 0.650 | 153.0 ±2.0% | 1.50× |" in md
  assert "| 1 | 1.60 | 0.600 | 132.6 ±2.0% | 1.30× |" in md
  assert "| 0 | 1.00 | — | 102.0 ±2.0% | 1.00× |" in md
  assert "**method=ngram**" in md and "**method=eagle3**" in md
  # A failed gate in any leg withholds the speed figures, never the acceptance ones.
  assert "| 2 | 2.80 | 0.900 | n/a† | n/a† |" in md and tables.GATE_NOTE in md
  assert "ngram: τ knee at k=4" in md and "fastest k=2" in md  # gains 0.7, 0.7: no knee before 4
  assert "device=cpu" in md and "legs per cell: 2" in md
  tex = (tmp_path / "table_draft_budget.tex").read_text()
  assert r"\toprule" in tex and r"\bottomrule" in tex and r"\midrule" in tex
  assert r"2 & 2.30 & 0.650 & 153.0 $\pm$2.0\% & 1.50$\times$ \\" in tex
  assert r"\textit{method=ngram}" in tex
  png = tmp_path / "tau_vs_k.png"
  assert png in written and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_per_position_table_and_plot(tmp_path):
  path = _write(tmp_path, _draft_budget_rows())
  md, written = table_main.run(path, "per_position", tmp_path / "out")
  # k=2: uncond [8/10, 5/10], cond [8/10, 5/8]; k=1 rows leave pos-1 empty.
  assert "| 2 | 2.30 | uncond | 0.800 | 0.500 |  |  |" in md
  assert "| 2 | 2.30 | cond | 0.800 | 0.625 |  |  |" in md
  assert "| 1 | 1.60 | uncond | 0.600 |  |  |  |" in md
  assert "| k | τ | kind | pos-0 | pos-1 | pos-2 | pos-3 |" in md
  assert "null" not in md.split("\n", 3)[3]  # the k = 0 baseline has no positions
  assert (tmp_path / "out" / "per_position.png").stat().st_size > 1000
  assert (tmp_path / "out" / "table_per_position.tex") in written


def test_pooled_histogram_across_legs():
  rows = [_row("ngram", 1, [[3, 1]], 1.0, 0), _row("ngram", 1, [[1, 3]], 1.0, 1)]
  (cell,) = tables.aggregate(rows)
  np.testing.assert_allclose(cell.uncond, [0.5])
  assert cell.legs == [0, 1] and cell.mean["tau"] == pytest.approx(1.5)


def test_context_table(tmp_path):
  rows = []
  for leg in (0, 1):
    for p, hist in ((512, [[2, 3, 5]]), (4096, [[6, 3, 1]])):
      over = {"prompt_tokens": p}
      rows.append(_row("null", 0, [[10]], 100.0 - p / 100, leg, **over))
      rows.append(_row("ngram", 2, hist, 2 * (100.0 - p / 100), leg, **over))
  path = _write(tmp_path, rows)
  md, written = table_main.run(path, "context")
  assert "| 4096 | 1.50 | 0.250 | 118.1 ±0.0% | 2.00× |" in md
  assert "| 512 | 2.30 | 0.650 | 189.8 ±0.0% | 2.00× |" in md
  assert md.index("**method=null, k=0**") < md.index("**method=ngram, k=2**")  # sweep order
  assert (tmp_path / "tau_vs_ctx.png").exists()


def test_method_workload_table(tmp_path):
  rows = []
  for t in (0.0, 1.0):
    for w, scale in (("humaneval", 1.0), ("mtbench", 0.5)):
      over = {"temperature": t, "workload": w}
      rows.append(_row("null", 0, [[10]], 100.0, 0, **over))
      rows.append(_row("ngram", 2, [[2, 3, 5]], 100.0 + 100 * scale, 0, **over))
      rows.append(_row("eagle3", 4, [[0, 0, 0, 5, 5]], 300.0 * scale, 0, **over))
  md, _ = table_main.run(_write(tmp_path, rows), "method_workload")
  assert "| method | humaneval | mtbench | Mean |" in md
  assert "| ngram (k=2) | 2.00×/2.30 | 1.50×/2.30 | 1.75×/2.30 |" in md
  assert "| eagle3 (k=4) | 3.00×/4.50 | 1.50×/4.50 | 2.25×/4.50 |" in md
  assert "**T=0.0**" in md and "**T=1.0**" in md
  assert "null (k=0)" not in md


def test_concurrency_table(tmp_path):
  rows = []
  for b in (1, 2, 4, 8):
    rows.append(_row("null", 0, [[10]], 100.0, 0, batch=b, whole_tok_s=100.0 * b))
    rows.append(_row("ngram", 2, [[2, 3, 5]], 1.0, 0, batch=b, whole_tok_s=100.0 * b * 2 / b**0.5))
  md, _ = table_main.run(_write(tmp_path, rows), "concurrency")
  assert "| method | c1 | c2 | c4 | c8 | avg τ |" in md
  assert "| null (k=0) | 100.0 | 200.0 | 400.0 | 800.0 | 1.00 |" in md
  assert (
    "| ngram (k=2) | 200.0 (2.00×) | 282.8 (1.41×) | 400.0 (1.00×) | 565.7 (0.71×) | 2.30 |" in md
  )


def test_missing_baseline_gives_dash(tmp_path):
  rows = [_row("ngram", 2, [[2, 3, 5]], 150.0, 0)]
  md = tables.to_markdown(tables.build(rows, "draft_budget"))
  assert "| 2 | 2.30 | 0.650 | 150.0 | — |" in md


def test_corrupt_line_error_through_cli(tmp_path):
  path = _write(tmp_path, _draft_budget_rows()[:3])
  lines = path.read_text().splitlines(keepends=True)
  lines[1] = lines[1][:30] + "\n"
  path.write_text("".join(lines))
  with pytest.raises(results.ResultsError, match=r"results.jsonl:2: corrupt"):
    table_main.run(path, "draft_budget")


def test_unknown_layout_and_empty():
  with pytest.raises(ValueError, match="unknown layout"):
    tables.build([_row("ngram", 1, [[1, 1]], 1.0, 0)], "nope")
  with pytest.raises(ValueError, match="no result rows"):
    tables.build([], "draft_budget")


def test_latex_escape():
  assert tables.latex_escape("a_b 50% τ×") == r"a\_b 50\% $\tau$$\times$"
  assert tables.latex_escape("gain < 0.1") == r"gain $<$ 0.1"


def test_series_for_plots():
  cells = tables.aggregate(_draft_budget_rows())
  s = tables.tau_vs_k_series(cells)
  assert s["method=ngram"]["k"] == [1, 2, 4]
  assert s["method=ngram"]["tau"] == pytest.approx([1.6, 2.3, 3.7])
  # Speed of a gate-failed cell is not plotted either.
  assert math.isnan(s["method=eagle3"]["decode_tok_s"][0])


def test_duplicate_leg_counts_once():
  rows = [_row("ngram", 1, [[9, 1]], 1.0, 0), _row("ngram", 1, [[1, 3]], 1.0, 0)]
  (cell,) = tables.aggregate(rows)
  assert cell.legs == [0] and cell.mean["tau"] == 1.75
  np.testing.assert_allclose(cell.uncond, [0.75])
