"""Paper-style tables from results.jsonl rows: Markdown for the terminal, LaTeX (booktabs) to paste.

Legs are aggregated per cell: scalar metrics are the mean over legs, tok/s columns also show the leg
spread as "±x%" (half the range over the mean, metrics.leg_spread), and per-position curves come
from the legs' pooled histograms. Speedup is paired by leg (arms run interleaved, so leg l of a
method and leg l of the baseline ran side by side), averaged over the shared legs. A speed figure
whose cell or baseline failed the greedy correctness gate is withheld, never printed
(docs/design.md, "Measurement conventions").

Conditions every row of a table shares go in its caption; conditions that vary become block titles,
so a number is never shown without what it was measured under.
"""

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from specdec import metrics
from specdec.lab.results import CELL_FIELDS

log = logging.getLogger(__name__)

# A cell across legs: the resume key minus the per-leg seed, plus the device (never mix devices).
AGG_FIELDS = tuple(f for f in CELL_FIELDS if f != "seed") + ("device",)
# What a method's cell shares with its baseline cell.
BASELINE_MATCH = tuple(f for f in AGG_FIELDS if f not in ("method", "k", "acceptance", "drafter"))
DEFAULT_BASELINE = "null"
LAYOUTS = ("draft_budget", "per_position", "context", "method_workload", "concurrency")
WITHHELD = "n/a†"
GATE_NOTE = "† withheld: the greedy correctness gate failed for this cell or its baseline."

_SCALARS = (
  "tau",
  "acceptance_rate",
  "alpha",
  "predicted_tau",
  "decode_tok_s",
  "whole_tok_s",
  "ttft_ms_median",
  "ttft_ms_p90",
  "ttft_ms_p99",
)


@dataclasses.dataclass
class Cell:
  """One cell aggregated over its legs."""

  conditions: dict
  legs: list[int]
  gate_passed: bool
  mean: dict[str, float]  # _SCALARS, mean over legs (NaN if no leg has it)
  spread: dict[str, float]  # rel_half_range of each scalar over legs
  per_leg: dict[str, dict[int, float]]  # scalar -> {leg: value}
  uncond: np.ndarray
  cond: np.ndarray
  speedup: float = math.nan  # filled by attach_speedups
  speedup_gate: bool = True  # False: cell or baseline failed the gate

  @property
  def method(self) -> str:
    return self.conditions["method"]

  @property
  def k(self) -> int:
    return self.conditions["k"]


@dataclasses.dataclass
class Table:
  title: str
  caption: str
  header: list[str]
  blocks: list[tuple[str, list[list[str]]]]
  notes: list[str]


def _num(v) -> float:
  return math.nan if v is None else float(v)


def aggregate(rows: Iterable[Mapping]) -> list[Cell]:
  """Group rows by AGG_FIELDS and aggregate their legs, in first-seen order."""
  groups: dict[tuple, list[Mapping]] = {}
  for row in rows:
    groups.setdefault(tuple(row.get(f) for f in AGG_FIELDS), []).append(row)
  cells = []
  for key, group in groups.items():
    # A leg written twice (a cell re-run by hand) counts once, the later row winning, so the
    # pooled histograms and the leg means agree on what a leg is.
    by_leg = {r.get("leg", i): r for i, r in enumerate(group)}
    if len(by_leg) < len(group):
      log.warning("cell %s: %d duplicate leg rows, keeping the last", key, len(group) - len(by_leg))
    legs = list(by_leg.values())
    per_leg = {s: {leg: _num(r.get(s)) for leg, r in by_leg.items()} for s in _SCALARS}
    spreads = {s: metrics.leg_spread(list(v.values())) for s, v in per_leg.items()}
    uncond, cond = _pooled_curves(legs)
    cells.append(
      Cell(
        conditions=dict(zip(AGG_FIELDS, key, strict=True)),
        legs=sorted(per_leg["tau"]),
        gate_passed=all(bool(r.get("gate_passed")) for r in legs),
        mean={s: sp["mean"] for s, sp in spreads.items()},
        spread={s: sp["rel_half_range"] for s, sp in spreads.items()},
        per_leg=per_leg,
        uncond=uncond,
        cond=cond,
      )
    )
  return cells


def _pooled_curves(legs: Sequence[Mapping]) -> tuple[np.ndarray, np.ndarray]:
  hists = [r["accept_hist"] for r in legs if r.get("accept_hist") is not None]
  if hists and len(hists) == len(legs):
    pooled = metrics.merge_hists(hists)
    return metrics.per_position_uncond(pooled), metrics.per_position_cond(pooled)
  # Rows without a histogram: fall back to the mean of their stored curves.
  curves = []
  for name in ("per_position_uncond", "per_position_cond"):
    vals = [np.array([_num(x) for x in r[name]]) for r in legs if r.get(name) is not None]
    curves.append(np.nanmean(vals, axis=0) if vals else np.array([]))
  return curves[0], curves[1]


def attach_speedups(
  cells: list[Cell], baseline: str = DEFAULT_BASELINE, metric: str = "decode_tok_s"
) -> None:
  """Set each cell's speedup of `metric` over the matching `baseline` cell, paired by leg."""
  bases: dict[tuple, list[Cell]] = {}
  for c in cells:
    if c.method == baseline:
      bases.setdefault(tuple(c.conditions[f] for f in BASELINE_MATCH), []).append(c)
  for c in cells:
    candidates = bases.get(tuple(c.conditions[f] for f in BASELINE_MATCH), [])
    if not candidates:
      c.speedup = math.nan
      continue
    # Prefer a baseline measured under the same acceptance mode when there is a choice.
    same = [b for b in candidates if b.conditions["acceptance"] == c.conditions["acceptance"]]
    base = (same or candidates)[0]
    c.speedup_gate = c.gate_passed and base.gate_passed
    mine, theirs = c.per_leg[metric], base.per_leg[metric]
    shared = sorted(set(mine) & set(theirs))
    ratios = [metrics.speedup(mine[leg], theirs[leg]) for leg in shared]
    ratios = [r for r in ratios if not math.isnan(r)]
    c.speedup = (
      float(np.mean(ratios)) if ratios else metrics.speedup(c.mean[metric], base.mean[metric])
    )


# --- formatting ---------------------------------------------------------------------------------


def _fmt(v: float, digits: int) -> str:
  return "—" if v is None or math.isnan(v) else f"{v:.{digits}f}"


def _rate(c: Cell, metric: str) -> str:
  if not c.gate_passed:
    return WITHHELD
  s = _fmt(c.mean[metric], 1)
  if len(c.legs) > 1 and not math.isnan(c.spread[metric]):
    s += f" ±{100 * c.spread[metric]:.1f}%"
  return s


def _speedup(c: Cell) -> str:
  if not c.speedup_gate:
    return WITHHELD
  return "—" if math.isnan(c.speedup) else f"{c.speedup:.2f}×"


def _cond_str(conds: Mapping) -> str:
  short = {"temperature": "T", "prompt_tokens": "prompt"}
  return ", ".join(f"{short.get(k, k)}={v}" for k, v in conds.items())


def _split(
  cells: list[Cell], axes: Sequence[str], always_block: Sequence[str] = ()
) -> tuple[dict, list[tuple[str, list[Cell]]]]:
  """(constant conditions, [(block title, cells)]) with blocks keyed by the varying conditions."""
  fields = [f for f in AGG_FIELDS if f not in axes]
  varying = [f for f in fields if f in always_block or len({c.conditions[f] for c in cells}) > 1]
  constant = {f: cells[0].conditions[f] for f in fields if f not in varying} if cells else {}
  blocks: dict[tuple, list[Cell]] = {}
  for c in cells:
    blocks.setdefault(tuple(c.conditions[f] for f in varying), []).append(c)
  # Blocks keep the order the sweep wrote them in, which is the order the sweep config lists.
  return constant, [(_cond_str(dict(zip(varying, k, strict=True))), v) for k, v in blocks.items()]


def _caption(constant: Mapping, cells: list[Cell], extra: str = "") -> str:
  legs = sorted({len(c.legs) for c in cells})
  parts = [_cond_str({k: v for k, v in constant.items() if v is not None})]
  parts.append(f"legs per cell: {'/'.join(map(str, legs))}")
  return "; ".join(p for p in (*parts, extra) if p)


# --- layouts ------------------------------------------------------------------------------------


def draft_budget(cells: list[Cell], knee_threshold: float = 0.1) -> Table:
  """k | tau | acceptance | decode tok/s | speedup, one block per method."""
  constant, blocks = _split(cells, ["k"], always_block=["method"])
  out, notes = [], []
  for title, bc in blocks:
    bc = sorted(bc, key=lambda c: c.k)
    rows = [
      [
        str(c.k),
        _fmt(c.mean["tau"], 2),
        _fmt(c.mean["acceptance_rate"], 3),
        _rate(c, "decode_tok_s"),
        _speedup(c),
      ]
      for c in bc
    ]
    out.append((title, rows))
    notes.append(_knee_note(title, bc, knee_threshold))
  return Table(
    "Draft budget",
    _caption(constant, cells, "tok/s: decode-only rate"),
    ["k", "τ", "acceptance", "decode tok/s", "speedup"],
    out,
    [n for n in notes if n],
  )


def _knee_note(title: str, bc: list[Cell], threshold: float) -> str:
  drafted = [c for c in bc if c.k > 0 and not math.isnan(c.mean["tau"])]
  if len(drafted) < 2:
    return ""
  knee = metrics.tau_knee([c.k for c in drafted], [c.mean["tau"] for c in drafted], threshold)
  note = f"{title}: τ knee at k={knee} (next gain < {threshold} τ per extra draft token)"
  fast = [c for c in drafted if c.gate_passed and not math.isnan(c.mean["decode_tok_s"])]
  if fast:
    note += (
      f"; fastest k={metrics.best_k([c.k for c in fast], [c.mean['decode_tok_s'] for c in fast])}"
    )
  return note


def per_position(cells: list[Cell]) -> Table:
  """Acceptance per draft position, unconditional and conditional, one block per method."""
  drafted = [c for c in cells if c.k > 0]
  kmax = max((c.k for c in drafted), default=0)
  constant, blocks = _split(drafted, ["k"], always_block=["method"])
  out = []
  for title, bc in blocks:
    rows = []
    for c in sorted(bc, key=lambda c: c.k):
      for kind, curve in (("uncond", c.uncond), ("cond", c.cond)):
        vals = [_fmt(v, 3) for v in curve] + [""] * (kmax - len(curve))
        rows.append([str(c.k), _fmt(c.mean["tau"], 2), kind, *vals])
    out.append((title, rows))
  notes = ["uncond: P(first i+1 drafts all accepted), τ = 1 + Σ uncond; cond: P(i | < i accepted)."]
  return Table(
    "Acceptance by draft position",
    _caption(constant, drafted),
    ["k", "τ", "kind", *[f"pos-{i}" for i in range(kmax)]],
    out,
    notes,
  )


def context(cells: list[Cell]) -> Table:
  """prompt tokens | tau | acceptance | tok/s | speedup vs no draft, one block per method."""
  constant, blocks = _split(cells, ["prompt_tokens"], always_block=["method"])
  out = []
  for title, bc in blocks:
    rows = [
      [
        str(c.conditions["prompt_tokens"]),
        _fmt(c.mean["tau"], 2),
        _fmt(c.mean["acceptance_rate"], 3),
        _rate(c, "decode_tok_s"),
        _speedup(c),
      ]
      for c in sorted(bc, key=lambda c: c.conditions["prompt_tokens"])
    ]
    out.append((title, rows))
  return Table(
    "Context length",
    _caption(constant, cells, "tok/s: decode-only rate; speedup vs no draft"),
    ["prompt tokens", "τ", "acceptance", "decode tok/s", "speedup"],
    out,
    [],
  )


def _method_label(c: Cell) -> str:
  return f"{c.method} (k={c.k})"


def method_workload(cells: list[Cell], baseline: str = DEFAULT_BASELINE) -> Table:
  """(speedup, tau) per method x workload and their mean; blocks by temperature (EAGLE-3 Tab. 1)."""
  drafted = [c for c in cells if c.method != baseline]
  workloads = list(dict.fromkeys(c.conditions["workload"] for c in drafted))
  constant, blocks = _split(drafted, ["method", "k", "workload"], always_block=["temperature"])
  out = []
  for title, bc in blocks:
    by_method: dict[str, dict[str, Cell]] = {}
    for c in bc:
      by_method.setdefault(_method_label(c), {})[c.conditions["workload"]] = c
    rows = []
    for label, per_w in by_method.items():
      cs = [per_w.get(w) for w in workloads]
      rows.append([label, *[_pair(c) for c in cs], _mean_pair([c for c in cs if c is not None])])
    out.append((title, rows))
  return Table(
    "Speedup and τ by method and workload",
    _caption(constant, drafted, "cells: speedup (decode tok/s vs no draft) / τ"),
    ["method", *workloads, "Mean"],
    out,
    [],
  )


def _pair(c: Cell | None) -> str:
  if c is None:
    return ""
  return f"{_speedup(c)}/{_fmt(c.mean['tau'], 2)}"


def _mean_pair(cs: list[Cell]) -> str:
  if not cs:
    return ""
  tau = _fmt(float(np.nanmean([c.mean["tau"] for c in cs])), 2)
  if not all(c.speedup_gate for c in cs):
    return f"{WITHHELD}/{tau}"
  sp = [c.speedup for c in cs if not math.isnan(c.speedup)]
  return f"{np.mean(sp):.2f}×/{tau}" if sp else f"—/{tau}"


def concurrency(cells: list[Cell], baseline: str = DEFAULT_BASELINE) -> Table:
  """Whole-run tok/s (speedup) per batch size c1, c2, c4, ... and the mean tau (DFlash Table 3).

  Uses the whole-run rate, the throughput a server at that concurrency delivers; call
  attach_speedups with metric="whole_tok_s" first.
  """
  batches = sorted({c.conditions["batch"] for c in cells})
  constant, blocks = _split(cells, ["method", "k", "batch"])
  out = []
  for title, bc in blocks:
    by_method: dict[str, dict[int, Cell]] = {}
    for c in sorted(bc, key=lambda c: (c.method != baseline, c.method, c.k)):
      by_method.setdefault(_method_label(c), {})[c.conditions["batch"]] = c
    rows = []
    for label, per_b in by_method.items():
      cols = []
      for b in batches:
        c = per_b.get(b)
        if c is None:
          cols.append("")
        elif c.method == baseline or not c.speedup_gate:
          cols.append(_rate(c, "whole_tok_s"))
        else:
          cols.append(f"{_rate(c, 'whole_tok_s')} ({_speedup(c)})")
      taus = [c.mean["tau"] for c in per_b.values()]
      rows.append([label, *cols, _fmt(float(np.nanmean(taus)), 2)])
    out.append((title, rows))
  return Table(
    "Concurrency",
    _caption(constant, cells, "cells: whole-run tok/s (speedup vs no draft)"),
    ["method", *[f"c{b}" for b in batches], "avg τ"],
    out,
    [],
  )


def build(
  rows: Iterable[Mapping],
  layout: str,
  baseline: str = DEFAULT_BASELINE,
  knee_threshold: float = 0.1,
) -> Table:
  """The named layout's table from raw rows."""
  if layout not in LAYOUTS:
    raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
  cells = aggregate(rows)
  if not cells:
    raise ValueError("no result rows to tabulate")
  attach_speedups(cells, baseline, "whole_tok_s" if layout == "concurrency" else "decode_tok_s")
  makers: dict[str, Callable[[], Table]] = {
    "draft_budget": lambda: draft_budget(cells, knee_threshold),
    "per_position": lambda: per_position(cells),
    "context": lambda: context(cells),
    "method_workload": lambda: method_workload(cells, baseline),
    "concurrency": lambda: concurrency(cells, baseline),
  }
  table = makers[layout]()
  if any(WITHHELD in cell for _, rs in table.blocks for r in rs for cell in r):
    table.notes.append(GATE_NOTE)
  return table


# --- rendering ----------------------------------------------------------------------------------


def to_markdown(t: Table) -> str:
  lines = [f"### {t.title}", "", t.caption, ""]
  align = "|" + "|".join(["---"] + ["---:"] * (len(t.header) - 1)) + "|"
  for title, rows in t.blocks:
    if title:
      lines += [f"**{title}**", ""]
    lines += ["| " + " | ".join(t.header) + " |", align]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines.append("")
  lines += [f"* {n}" for n in t.notes]
  return "\n".join(lines).rstrip() + "\n"


_LATEX_SPECIAL = {
  "\\": r"\textbackslash{}",
  "&": r"\&",
  "%": r"\%",
  "$": r"\$",
  "#": r"\#",
  "_": r"\_",
  "{": r"\{",
  "}": r"\}",
  "~": r"\textasciitilde{}",
  "^": r"\textasciicircum{}",
  "×": r"$\times$",
  "±": r"$\pm$",
  "τ": r"$\tau$",
  "Σ": r"$\Sigma$",
  "—": "--",
  "†": r"$^\dagger$",
  "<": r"$<$",
  ">": r"$>$",
}


def latex_escape(s: str) -> str:
  return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in s)


def to_latex(t: Table) -> str:
  """A booktabs table: one tabular, blocks separated by \\midrule under an italic block title."""
  n = len(t.header)
  lines = [
    r"% requires \usepackage{booktabs}",
    r"\begin{table}[t]",
    r"\centering",
    rf"\caption{{{latex_escape(t.title)}. {latex_escape(t.caption)}}}",
    r"\begin{tabular}{l" + "r" * (n - 1) + "}",
    r"\toprule",
    " & ".join(latex_escape(h) for h in t.header) + r" \\",
  ]
  for title, rows in t.blocks:
    lines.append(r"\midrule")
    if title:
      lines.append(rf"\multicolumn{{{n}}}{{l}}{{\textit{{{latex_escape(title)}}}}} \\")
    lines += [" & ".join(latex_escape(c) for c in r) + r" \\" for r in rows]
  lines += [r"\bottomrule", r"\end{tabular}"]
  if t.notes:
    lines.append(r"\par\smallskip\footnotesize " + r" \\ ".join(latex_escape(x) for x in t.notes))
  lines.append(r"\end{table}")
  return "\n".join(lines) + "\n"


# --- series for plots ---------------------------------------------------------------------------


def _series_label(c: Cell, varying: Sequence[str]) -> str:
  return _cond_str({f: c.conditions[f] for f in varying}) or c.method


def _varying(cells: list[Cell], axes: Sequence[str], always: Sequence[str] = ("method",)) -> list:
  return [
    f
    for f in AGG_FIELDS
    if f not in axes and (f in always or len({c.conditions[f] for c in cells}) > 1)
  ]


def per_position_series(cells: list[Cell]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{label: (uncond, cond)} for every drafted cell."""
  drafted = [c for c in cells if c.k > 0]
  varying = _varying(drafted, [], always=("method", "k"))
  return {_series_label(c, varying): (c.uncond, c.cond) for c in drafted}


def tau_vs_k_series(cells: list[Cell]) -> dict[str, dict[str, list]]:
  """{label: {"k", "tau", "decode_tok_s"}} per method (and other varying conditions), by k."""
  return _xy_series(cells, "k", ("tau", "decode_tok_s"))


def tau_vs_context_series(cells: list[Cell]) -> dict[str, dict[str, list]]:
  """{label: {"prompt_tokens", "tau", "acceptance_rate"}} per method and k."""
  return _xy_series(cells, "prompt_tokens", ("tau", "acceptance_rate"))


def _xy_series(cells: list[Cell], x: str, ys: Sequence[str]) -> dict[str, dict[str, list]]:
  varying = _varying(cells, [x])
  out: dict[str, dict[str, list]] = {}
  for c in sorted(cells, key=lambda c: c.conditions[x]):
    s = out.setdefault(_series_label(c, varying), {x: [], **{y: [] for y in ys}})
    s[x].append(c.conditions[x])
    for y in ys:
      ok = y not in ("decode_tok_s", "whole_tok_s") or c.gate_passed
      s[y].append(c.mean[y] if ok else math.nan)
  return out
