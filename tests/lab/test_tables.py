import math

import numpy as np
import pytest

from specdec import metrics
from specdec.lab import report as table_main
from specdec.lab import results, tables
from tests.helpers import result_row


def _acceptance(hist):
  """The sweep's acceptance fields for steps none of which was cut (tau = tau_accepted)."""
  hist = np.asarray(hist)
  emitted = (hist * np.arange(1, hist.shape[-1] + 1)).sum(-1)
  return metrics.acceptance_summary(hist, 0 * hist, emitted)


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
    **_acceptance(hist),
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


def _method_workload_rows(
  workloads=(("humaneval", 1.0), ("mtbench", 0.5)), temperatures=(0.0, 1.0)
):
  rows = []
  for t in temperatures:
    for w, scale in workloads:
      over = {"temperature": t, "workload": w}
      rows.append(_row("null", 0, [[10]], 100.0, 0, **over))
      rows.append(_row("ngram", 2, [[2, 3, 5]], 100.0 + 100 * scale, 0, **over))
      rows.append(_row("eagle3", 4, [[0, 0, 0, 5, 5]], 300.0 * scale, 0, **over))
  return rows


def test_method_workload_is_one_table_with_a_column_group_per_workload(tmp_path):
  rows = _method_workload_rows()
  # Drafters name their checkpoints: a condition that varies with the method, not a block.
  for r in rows:
    r["drafter"] = {"eagle3": "zoo:eagle3"}.get(r["method"], r["method"])
  md, _ = table_main.run(_write(tmp_path, rows), "method_workload")
  head = (
    "| T | method | humaneval speedup | humaneval τ | mtbench speedup | mtbench τ | Mean speedup"
  )
  assert head + " | Mean τ |" in md and md.count("| T | method |") == 1
  body = [
    line for line in md.splitlines() if line.startswith("| 0.0 |") or line.startswith("| 1.0 |")
  ]
  assert body == [
    "| 0.0 | ngram (k=2) | 2.00× | 2.30 | 1.50× | 2.30 | 1.75× | 2.30 |",
    "| 0.0 | eagle3 (k=4) | 3.00× | 4.50 | 1.50× | 4.50 | 2.25× | 4.50 |",
    "| 1.0 | ngram (k=2) | 2.00× | 2.30 | 1.50× | 2.30 | 1.75× | 2.30 |",
    "| 1.0 | eagle3 (k=4) | 3.00× | 4.50 | 1.50× | 4.50 | 2.25× | 4.50 |",
  ]
  assert "**" not in md and "null (k=0)" not in md  # no blocks; the baseline is no row
  tex = (tmp_path / "table_method_workload.tex").read_text()
  assert r" &  & \multicolumn{2}{c}{humaneval} & \multicolumn{2}{c}{mtbench} & " in tex
  assert r"\cmidrule(lr){3-4}\cmidrule(lr){5-6}\cmidrule(lr){7-8}" in tex
  assert r"T & method & speedup & $\tau$ & speedup & $\tau$ & speedup & $\tau$ \\" in tex
  assert tex.count(r"\midrule") == 1


def test_method_workload_marks_gaps_withheld_figures_and_drafters():
  rows = _method_workload_rows(temperatures=(0.0,))
  rows = [r for r in rows if not (r["method"] == "eagle3" and r["workload"] == "mtbench")]
  for r in rows:
    if r["method"] == "ngram" and r["workload"] == "mtbench":
      r["gate_passed"] = False
  other = _row("ngram", 2, [[10, 0, 0]], 100.0, 0, drafter="ngram_max8")  # another sweep's
  md = tables.to_markdown(tables.build([*rows, other], "method_workload"))
  assert "| method | humaneval speedup |" in md  # T is constant: in the caption, no column
  assert "| ngram (k=2) [None] | 2.00× | 2.30 | n/a† | 2.30 | n/a† | 2.30 |" in md
  assert "| ngram (k=2) [ngram_max8] | 1.00× | 1.00 |  |  | 1.00× | 1.00 |" in md
  assert "| eagle3 (k=4) | 3.00× | 4.50 |  |  | 3.00× | 4.50 |" in md
  assert tables.GATE_NOTE in md


def test_table_cli_reads_several_results_files_and_globs(tmp_path):
  import subprocess
  import sys

  for w, scale in (("humaneval", 1.0), ("mtbench", 0.5)):
    (tmp_path / w).mkdir()
    _write(tmp_path / w, _method_workload_rows(((w, scale),), (0.0,)))
  extra = tmp_path / "extra.jsonl"
  cmd = [sys.executable, "-m", "experiments.table", "--layout=method_workload"]
  first = f"--results={tmp_path}/humaneval/results.jsonl"
  p = subprocess.run(
    [*cmd, f"--results={tmp_path}/*/results.jsonl", first], capture_output=True, text=True
  )
  assert p.returncode == 0, p.stderr
  assert "| method | humaneval speedup | humaneval τ | mtbench speedup |" in p.stdout
  assert "| ngram (k=2) | 2.00× | 2.30 | 1.50× | 2.30 | 1.75× | 2.30 |" in p.stdout
  assert (tmp_path / "humaneval" / "table_method_workload.tex").exists()  # beside the first
  p = subprocess.run([*cmd, f"{first},{extra}"], capture_output=True, text=True)
  assert p.returncode != 0 and f"--results: no file matches '{extra}'" in p.stderr


def test_concurrency_table(tmp_path):
  rows = []
  for b in (1, 2, 4, 8):
    rows.append(_row("null", 0, [[10]], 100.0, 0, batch=b, whole_tok_s=100.0 * b))
    rows.append(_row("ngram", 2, [[2, 3, 5]], 1.0, 0, batch=b, whole_tok_s=100.0 * b * 2 / b**0.5))
  md, _ = table_main.run(_write(tmp_path, rows), "concurrency")
  assert "| method | c1 | c2 | c4 | c8 | τ |" in md
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


# --- rows that keep their requests ----------------------------------------------------------------


def _entry(tpot, emitted, steps, k, timed=True, n_out=None, latency=None):
  n_out = emitted + 1 if n_out is None else n_out
  latency = 10.0 + tpot * (n_out - 1) if latency is None else latency
  accepted = emitted - steps
  return {
    "n_out": n_out, "ttft_ms": 10.0, "latency_ms": latency, "tpot_ms": tpot, "steps": steps,
    "emitted": emitted, "accepted": accepted, "proposed": k * steps, "tau": emitted / steps,
    "acceptance_rate": accepted / (k * steps) if k else None, "timed": timed,
  }  # fmt: skip


# Per prompt: the null arm's tpot, and the (emitted, steps) of the ngram k=2 arm. Prompt 0 is the
# warm-up (compile-slow in leg 0); the costs of prompts 1-3 differ a lot, the ngram arm halves each.
BASE_TPOT = {0: [900.0, 10.0, 30.0, 60.0], 1: [12.0, 11.0, 33.0, 66.0]}
COUNTS = {0: [(9, 4), (8, 4), (12, 5), (6, 4)], 1: [(10, 4), (9, 5), (11, 4), (7, 4)]}


def _request_rows():
  rows = []
  for leg in (0, 1):
    base, counts = BASE_TPOT[leg], COUNTS[leg]
    null = [_entry(t, 8, 8, 0, timed=i > 0) for i, t in enumerate(base)]
    ngram = [
      _entry(t / 2, e, s, 2, timed=i > 0)
      for i, (t, (e, s)) in enumerate(zip(base, counts, strict=True))
    ]
    for method, k, entries in (("null", 0, null), ("ngram", 2, ngram)):
      rows.append(_row(method, k, [[10]] if k == 0 else [[2, 3, 5]], 1.0, leg, requests=entries))
  return rows


def test_tables_pool_requests_and_print_bootstrap_intervals(tmp_path):
  rows = _request_rows()
  cells = {c.method: c for c in tables.aggregate(rows)}
  ngram = cells["ngram"]
  # tau pools every request (the warm-up's counts are as good as any): sum emitted / sum steps.
  emitted = [e for leg in (0, 1) for e, _ in COUNTS[leg]]
  steps = [s for leg in (0, 1) for _, s in COUNTS[leg]]
  assert ngram.mean["tau"] == pytest.approx(sum(emitted) / sum(steps))
  assert ngram.ci["tau"] == pytest.approx(metrics.paired_ratio_ci(emitted, steps))
  lo, hi = ngram.ci["tau"]
  assert lo < ngram.mean["tau"] < hi
  acc = [e - s for e, s in zip(emitted, steps, strict=True)]
  assert ngram.mean["acceptance_rate"] == pytest.approx(sum(acc) / (2 * sum(steps)))
  # Rates pool the timed requests only: the 900 ms warm-up would drag leg 0 to ~7 tok/s.
  timed = [t for leg in (0, 1) for t in BASE_TPOT[leg][1:]]
  assert cells["null"].mean["decode_tok_s"] == pytest.approx(1000 / np.mean(timed))
  # The arm halves every prompt's cost: paired by prompt, the speedup is 2 exactly.
  tables.attach_speedups(list(cells.values()))
  assert ngram.speedup == pytest.approx(2.0) and ngram.speedup_ci == pytest.approx((2.0, 2.0))

  md, written = table_main.run(_write(tmp_path, rows), "draft_budget")
  tau, tau_ci = ngram.mean["tau"], ngram.ci["tau"]
  assert f"| 2 | {tau:.2f} [{tau_ci[0]:.2f}, {tau_ci[1]:.2f}] | " in md
  lo, hi = metrics.bootstrap_ci(timed, stat=lambda x, axis: 1000 / np.mean(x, axis=axis))
  rate = 1000 / np.mean(timed)
  assert f"| {rate:.1f} [{lo:.1f}, {hi:.1f}] ±" in md.split("**method=null**")[1].split("\n")[4]
  assert "| 2.00× [2.00, 2.00] |" in md
  assert "| 0 | 1.00 [1.00, 1.00] | — |" in md and "| 1.00× |" in md  # k = 0, the baseline
  assert "95% bootstrap CI over requests, 2000 resamples" in md
  tex = (tmp_path / "table_draft_budget.tex").read_text()
  assert "95\\% bootstrap CI over requests, 2000 resamples" in tex
  assert f"{tau:.2f} {{[}}{tau_ci[0]:.2f}, {tau_ci[1]:.2f}{{]}}" in tex


def test_every_layout_prints_intervals_and_old_rows_print_values_alone(tmp_path):
  rows = _request_rows()
  for layout in ("per_position", "context", "method_workload", "concurrency"):
    md = tables.to_markdown(tables.build(rows, layout))
    assert "bootstrap CI over requests" in md, layout
    if layout in ("context", "method_workload"):  # decode-rate speedups: 2 for every prompt
      assert "2.00× [2.00, 2.00]" in md, layout
    if layout == "concurrency":  # whole-run: the arm also emits other token counts
      assert "(2.06× [" in md
    assert " [" in md.split("|", 1)[1], layout
  old = [{k: v for k, v in r.items() if k != "requests"} for r in rows]
  for layout in tables.LAYOUTS:
    md = tables.to_markdown(tables.build(old, layout))
    body = md.split("\n", 3)[3]
    assert "[" not in body.replace("[0", ""), layout  # no interval anywhere
    assert "bootstrap" not in md, layout
  md = tables.to_markdown(tables.build(old, "draft_budget"))
  assert "| 2 | 2.30 | 0.650 | 1.0 ±0.0% | 1.00× |" in md


def test_paired_speedup_needs_the_same_prompt_leg_and_seed():
  rows = _request_rows()
  # Shift the arm's requests by one prompt: the pairs now mix prompts of very different cost.
  for r in rows:
    if r["method"] == "ngram":
      r["requests"] = r["requests"][1:] + r["requests"][:1]
      for i, e in enumerate(r["requests"]):
        e["timed"] = i > 0
  cells = tables.aggregate(rows)
  tables.attach_speedups(cells)
  ngram = next(c for c in cells if c.method == "ngram")
  lo, hi = ngram.speedup_ci
  assert hi - lo > 0.5  # unpaired prompts: the prompts' own variation is in the interval


def test_concurrency_whole_run_rate_from_batch_wall_clocks():
  rows = []
  for leg in (0, 1):
    # Batch 2: prompts (0, 1) warm-up, (2, 3) timed; latencies 40 and 50 ms -> the batch's wall
    # clock is 50 ms, each request's share 25 ms.
    entries = [
      _entry(5.0, 8, 8, 0, timed=i >= 2, latency=lat) for i, lat in enumerate([900, 900, 40, 50])
    ]
    rows.append(_row("null", 0, [[10]], 1.0, leg, batch=2, requests=entries))
  (cell,) = tables.aggregate(rows)
  assert cell.mean["whole_tok_s"] == pytest.approx(1000 * 9 / 25)
  assert cell.ci["whole_tok_s"] == pytest.approx((360.0, 360.0))
  md = tables.to_markdown(tables.build(rows, "concurrency"))
  assert "| null (k=0) | 360.0 [360.0, 360.0] ±0.0% | 1.00 [1.00, 1.00] |" in md


def test_sample_seeds_of_a_cell_are_pooled(tmp_path):
  rows = []
  for seed in (0, 1):
    for r in _request_rows():
      rows.append({**r, "sample_seed": seed, "seed": 1_000_000 * seed + 1000 * r["leg"]})
  cells = tables.aggregate(rows)
  assert len(cells) == 2  # null, ngram: the seeds are runs of one cell
  ngram = next(c for c in cells if c.method == "ngram")
  assert ngram.seeds == [0, 1] and ngram.legs == [0, 1] and len(ngram.requests) == 16
  assert len(ngram.per_run["tau"]) == 4
  md = tables.to_markdown(tables.build(rows, "draft_budget"))
  assert "sample seeds per cell (pooled): 2" in md and "legs per cell: 2" in md


def test_series_carry_intervals_and_plots_draw_them(tmp_path):
  from specdec.lab import plots

  cells = tables.aggregate(_request_rows())
  s = tables.tau_vs_k_series(cells)["method=ngram"]
  ngram = next(c for c in cells if c.method == "ngram")
  assert s["tau_ci"] == [ngram.ci["tau"]] and s["decode_tok_s_ci"] == [ngram.ci["decode_tok_s"]]
  with_bars = plots.tau_vs_k(tables.tau_vs_k_series(cells), tmp_path / "a.png").read_bytes()
  old = tables.aggregate([{k: v for k, v in r.items() if k != "requests"} for r in _request_rows()])
  assert math.isnan(tables.tau_vs_k_series(old)["method=ngram"]["tau_ci"][0][0])
  without = plots.tau_vs_k(tables.tau_vs_k_series(old), tmp_path / "b.png").read_bytes()
  assert with_bars != without
