"""Paper-style tables from results.jsonl rows: Markdown for the terminal, LaTeX (booktabs) to paste.

A cell's runs are its rows: one per leg and, for a sampled cell, per sample seed (the seeds of a
cell are pooled, as replicates). Where the rows keep their requests (`requests`), tau and
acceptance pool every request's counts (tau = sum emitted / sum steps), rates pool the timed
requests (decode tok/s = 1000 / mean tpot), and each figure carries a bootstrap interval over
requests (metrics.CI_LEVEL, metrics.CI_RESAMPLES), printed "3.92 [3.71, 4.10]". Speedup pairs each
timed request with the baseline's request of the same prompt, leg and seed (arms run interleaved,
so they ran side by side) and resamples the pairs jointly. Rows without requests (older files)
fall back to the mean over runs, with no interval. tok/s columns also show the spread over runs
as "±x%" (half the range over the mean, metrics.leg_spread). Per-position curves come from the
runs' pooled histograms. A speed figure whose cell or baseline failed the greedy correctness gate
is withheld, never printed (docs/design.md, "Measurement conventions").

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

# A cell across runs: the resume key minus the per-leg seed and the sample seed (runs of a cell),
# plus the device (never mix devices).
AGG_FIELDS = tuple(f for f in CELL_FIELDS if f not in ("seed", "sample_seed")) + ("device",)
# What a method's cell shares with its baseline cell.
BASELINE_MATCH = tuple(
  f for f in AGG_FIELDS if f not in ("method", "k", "tree", "acceptance", "drafter")
)
DEFAULT_BASELINE = "null"
LAYOUTS = ("draft_budget", "per_position", "context", "method_workload", "concurrency")
WITHHELD = "n/a†"
GATE_NOTE = "† withheld: the greedy correctness gate failed for this cell or its baseline."
SPREAD_NOTE = "±x%: half the range over runs"

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


# Figures pooled over requests, with an interval, where the rows keep their requests.
_POOLED = ("tau", "acceptance_rate", "decode_tok_s", "whole_tok_s")
NO_CI = (math.nan, math.nan)


@dataclasses.dataclass
class Cell:
  """One cell aggregated over its runs (legs x sample seeds)."""

  conditions: dict
  legs: list[int]
  seeds: list  # the sample seeds pooled in the cell ([None] for rows from before the axis)
  gate_passed: bool
  mean: dict[str, float]  # _SCALARS: pooled over requests (_POOLED, where kept), else run mean
  spread: dict[str, float]  # rel_half_range of each scalar over runs
  per_run: dict[str, dict[tuple, float]]  # scalar -> {(sample_seed, leg): value}
  uncond: np.ndarray
  cond: np.ndarray
  # (sample_seed, leg, prompt index) -> the row's request entry; empty if any run lacks them.
  requests: dict[tuple, dict] = dataclasses.field(default_factory=dict)
  ci: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)  # _POOLED
  speedup: float = math.nan  # filled by attach_speedups
  speedup_ci: tuple[float, float] = NO_CI
  speedup_gate: bool = True  # False: cell or baseline failed the gate
  tiers: list = dataclasses.field(default_factory=list)  # k="auto": its tiers, else []
  tier_hist: np.ndarray | None = None  # k="auto": row-steps per tier, pooled over runs
  verify_width: int | None = None  # tokens each verify feeds (rows' verify_width); None: unknown

  @property
  def method(self) -> str:
    return self.conditions["method"]

  @property
  def k(self) -> int | str:
    return self.conditions["k"]

  @property
  def auto(self) -> bool:
    return self.k == "auto"

  @property
  def tree(self) -> str | None:
    """A static tree's label (specdec.lab.trees); None: a chain."""
    return self.conditions.get("tree")


def k_order(c: "Cell") -> tuple:
  """Sorts cells by verify width (k + 1 for a chain), a tree after the chain of its width, and
  k="auto" after them all."""
  if c.auto:
    return (1, 0, c.tree or "")
  return (0, c.verify_width or c.k + 1, c.tree or "")


def k_label(c: "Cell") -> str:
  """A cell's entry in a k column: its k, a tree's label and depth, or "auto (trees)"."""
  if c.tree is None:
    return str(c.k)
  return "auto (trees)" if c.tree == "auto" else f"{c.tree} (tree, depth {c.k})"


def fixed_drafted(cells: Iterable["Cell"]) -> list["Cell"]:
  """The chains of a fixed k >= 1 (the k axis proper: no baseline, no "auto", no tree)."""
  return [c for c in cells if not c.auto and c.tree is None and c.k > 0]


@dataclasses.dataclass
class Table:
  title: str
  caption: str
  header: list[str]
  blocks: list[tuple[str, list[list[str]]]]
  notes: list[str]
  # Column groups over the header, (title, columns spanned) left to right, "" for ungrouped ones:
  # LaTeX spans them in a row above the header, Markdown prefixes each column's name.
  groups: list[tuple[str, int]] = dataclasses.field(default_factory=list)


def _num(v) -> float:
  return math.nan if v is None else float(v)


def aggregate(rows: Iterable[Mapping]) -> list[Cell]:
  """Group rows by AGG_FIELDS and aggregate their runs, in first-seen order."""
  groups: dict[tuple, list[Mapping]] = {}
  for row in rows:
    groups.setdefault(tuple(row.get(f) for f in AGG_FIELDS), []).append(row)
  cells = []
  for key, group in groups.items():
    # A run written twice (a cell re-run by hand) counts once, the later row winning, so the
    # pooled histograms and the run means agree on what a run is.
    by_run = {(r.get("sample_seed"), r.get("leg", i)): r for i, r in enumerate(group)}
    if len(by_run) < len(group):
      log.warning("cell %s: %d duplicate run rows, keeping the last", key, len(group) - len(by_run))
    runs = list(by_run.values())
    per_run = {s: {run: _num(r.get(s)) for run, r in by_run.items()} for s in _SCALARS}
    spreads = {s: metrics.leg_spread(list(v.values())) for s, v in per_run.items()}
    uncond, cond = _pooled_curves(runs)
    conditions = dict(zip(AGG_FIELDS, key, strict=True))
    cell = Cell(
      conditions=conditions,
      legs=sorted({leg for _, leg in by_run}),
      seeds=sorted({seed for seed, _ in by_run}, key=str),
      gate_passed=all(bool(r.get("gate_passed")) for r in runs),
      mean={s: sp["mean"] for s, sp in spreads.items()},
      spread={s: sp["rel_half_range"] for s, sp in spreads.items()},
      per_run=per_run,
      uncond=uncond,
      cond=cond,
      requests=_requests(by_run, conditions.get("batch") or 1),
      verify_width=runs[-1].get("verify_width"),
    )
    if all(r.get("tier_hist") is not None for r in runs) and conditions["k"] == "auto":
      cell.tiers = list(runs[0]["tiers"])
      cell.tier_hist = np.sum([r["tier_hist"] for r in runs], axis=0)
    if cell.requests:
      for name in _POOLED:
        cell.mean[name], cell.ci[name] = _pooled(name, list(cell.requests.values()))
    cells.append(cell)
  return cells


def _requests(by_run: Mapping[tuple, Mapping], batch: int) -> dict[tuple, dict]:
  """Every run's request entries keyed (sample_seed, leg, prompt index), each timed entry with
  `wall_ms`, its share of its batch's wall clock; {} unless every run kept its requests."""
  if not by_run or not all(isinstance(r.get("requests"), list) for r in by_run.values()):
    return {}
  out = {}
  for (seed, leg), row in by_run.items():
    entries = [{k: _num(v) if k != "timed" else v for k, v in e.items()} for e in row["requests"]]
    for start in range(0, len(entries), batch):
      group = entries[start : start + batch]
      # Requests of one batch start together; the last one seen done ends the batch's wall clock.
      wall = max(e["latency_ms"] for e in group)
      for i, e in enumerate(group, start):
        out[seed, leg, i] = {**e, "wall_ms": wall / len(group)}
  return out


def _decode_rate(tpot: np.ndarray) -> np.ndarray:
  return 1000.0 / tpot.mean(axis=-1)


def _whole_rate(n_out: np.ndarray, wall_ms: np.ndarray) -> np.ndarray:
  return 1000.0 * n_out.mean(axis=-1) / wall_ms.mean(axis=-1)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
  return num.mean(axis=-1) / den.mean(axis=-1)


# Each pooled figure: the request-entry columns it reads, whether only timed requests count, and
# the statistic of those columns (reducing the last axis, as metrics.paired_bootstrap_ci asks).
# tau and acceptance count every request (the warm-up's acceptance is as good as any); rates only
# the timed ones. Whole-run: tokens over the summed batch wall clocks (host gaps between the
# batches of a leg left out).
_STATS = {
  "tau": (("emitted", "steps"), False, _ratio),
  "acceptance_rate": (("accepted", "proposed"), False, _ratio),
  "decode_tok_s": (("tpot_ms",), True, _decode_rate),
  "whole_tok_s": (("n_out", "wall_ms"), True, _whole_rate),
}


def _columns(name: str, entries: Sequence[Mapping]) -> list[list[float]]:
  cols, timed_only, _ = _STATS[name]
  kept = [e for e in entries if e.get("timed") or not timed_only]
  return [[e[c] for e in kept] for c in cols]


def _estimate(columns: Sequence, stat: Callable) -> tuple[float, tuple[float, float]]:
  """(stat of the whole sample, its bootstrap interval over rows); NaN for an empty sample."""
  cols = metrics.complete_rows(columns)
  if cols[0].size == 0:
    return math.nan, NO_CI
  with np.errstate(divide="ignore", invalid="ignore"):
    point = float(stat(*(c[None, :] for c in cols))[0])
  if not math.isfinite(point):
    return math.nan, NO_CI
  return point, metrics.paired_bootstrap_ci(cols, stat)


def _pooled(name: str, entries: Sequence[Mapping]) -> tuple[float, tuple[float, float]]:
  return _estimate(_columns(name, entries), _STATS[name][2])


def _pooled_curves(legs: Sequence[Mapping]) -> tuple[np.ndarray, np.ndarray]:
  if legs and all(r.get("position_reached") is not None for r in legs):
    # k="auto": its histogram mixes tiers; exact counts per position are kept instead.
    pos = {
      n: np.sum([r[n] for r in legs], axis=0).astype(float)
      for n in ("position_offered", "position_reached", "position_accepted")
    }
    ratio = lambda a, b: np.where(b > 0, a / np.maximum(b, 1), np.nan)  # noqa: E731
    acc = pos["position_accepted"]
    return ratio(acc, pos["position_offered"]), ratio(acc, pos["position_reached"])
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
  """Set each cell's speedup of `metric` over the matching `baseline` cell: from paired requests
  with an interval where both keep them, else the mean of the per-run ratios."""
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
    if c is base:
      c.speedup = 1.0  # by definition: no interval to draw
      continue
    if c.requests and base.requests:
      c.speedup, c.speedup_ci = _paired_speedup(c, base, metric)
      continue
    mine, theirs = c.per_run[metric], base.per_run[metric]
    shared = sorted(set(mine) & set(theirs), key=str)
    ratios = [metrics.speedup(mine[run], theirs[run]) for run in shared]
    ratios = [r for r in ratios if not math.isnan(r)]
    c.speedup = (
      float(np.mean(ratios)) if ratios else metrics.speedup(c.mean[metric], base.mean[metric])
    )


def _paired_speedup(c: Cell, base: Cell, metric: str) -> tuple[float, tuple[float, float]]:
  """rate(cell) / rate(baseline) over the timed requests both ran (same prompt, leg and seed),
  pairs resampled jointly."""
  shared = [key for key, e in c.requests.items() if e["timed"] and key in base.requests]
  names, _, rate = _STATS[metric]
  m = len(names)
  mine = _columns(metric, [c.requests[key] for key in shared])
  theirs = _columns(metric, [base.requests[key] for key in shared])
  return _estimate([*mine, *theirs], lambda *cols: rate(*cols[:m]) / rate(*cols[m:]))


# --- formatting ---------------------------------------------------------------------------------


def _fmt(v: float, digits: int) -> str:
  return "—" if v is None or math.isnan(v) else f"{v:.{digits}f}"


def _with_ci(value: str, ci: tuple[float, float], digits: int) -> str:
  """`value [lo, hi]`, or the value alone where there is no interval."""
  lo, hi = ci
  if value == "—" or math.isnan(lo) or math.isnan(hi):
    return value
  return f"{value} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _value(c: Cell, metric: str, digits: int) -> str:
  """An acceptance figure (tau, acceptance rate) with its interval where the rows allow one."""
  return _with_ci(_fmt(c.mean[metric], digits), c.ci.get(metric, NO_CI), digits)


def _rate(c: Cell, metric: str) -> str:
  if not c.gate_passed:
    return WITHHELD
  s = _with_ci(_fmt(c.mean[metric], 1), c.ci.get(metric, NO_CI), 1)
  if len(c.per_run[metric]) > 1 and not math.isnan(c.spread[metric]):
    s += f" ±{100 * c.spread[metric]:.1f}%"
  return s


def _speedup(c: Cell) -> str:
  if not c.speedup_gate:
    return WITHHELD
  if math.isnan(c.speedup):
    return "—"
  return _with_ci(f"{c.speedup:.2f}×", c.speedup_ci, 2)


def _cond_str(conds: Mapping) -> str:
  """ "field=value, ..." of the conditions set (None, a chain's tree or a field older rows lack,
  says nothing)."""
  short = {"temperature": "T", "prompt_tokens": "prompt"}
  return ", ".join(f"{short.get(k, k)}={v}" for k, v in conds.items() if v is not None)


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
  seeds = sorted({len(c.seeds) for c in cells})
  if seeds != [1]:
    parts.append(f"sample seeds per cell (pooled): {'/'.join(map(str, seeds))}")
  if any(c.ci for c in cells):
    parts.append(
      f"[lo, hi]: {100 * metrics.CI_LEVEL:.0f}% bootstrap CI over requests, "
      f"{metrics.CI_RESAMPLES} resamples"
    )
  return "; ".join(p for p in (*parts, extra) if p)


# --- layouts ------------------------------------------------------------------------------------


def draft_budget(cells: list[Cell], knee_threshold: float = 0.1) -> Table:
  """k | tau | acceptance | decode tok/s | speedup, one block per method; with static-tree cells,
  a verify width column (nodes verified per step), each tree beside the chain of its width."""
  constant, blocks = _split(cells, ["k", "tree"], always_block=["method"])
  trees = any(c.tree is not None for c in cells)
  out, notes = [], []
  for title, bc in blocks:
    bc = sorted(bc, key=k_order)
    rows = [
      [
        k_label(c),
        *([_fmt(_num(c.verify_width), 0)] if trees else []),
        _value(c, "tau", 2),
        _value(c, "acceptance_rate", 3),
        _rate(c, "decode_tok_s"),
        _speedup(c),
      ]
      for c in bc
    ]
    out.append((title, rows))
    notes.append(_knee_note(title, bc, knee_threshold))
    notes += [_auto_note(title, c, bc) for c in bc if c.auto]
  if trees:
    notes.append(TREE_NOTE)
  return Table(
    "Draft budget",
    _caption(constant, cells, f"tok/s: decode-only rate; {SPREAD_NOTE}"),
    ["k", *(["verify width"] if trees else []), "τ", "acceptance", "decode tok/s", "speedup"],
    out,
    [n for n in notes if n],
  )


TREE_NOTE = (
  "verify width: tokens each verify feeds the target, k+1 for a chain, a static tree's nodes with "
  "its root; a tree's τ counts the tokens its accepted path emits, its acceptance the accepted "
  "drafts over its depth per step"
)


def _auto_note(title: str, c: Cell, bc: list[Cell]) -> str:
  """k="auto" or tree="auto": how often it ran each tier (a tree tier by its drafted nodes), and
  its decode rate against the fastest fixed k."""
  trees = c.tree == "auto"
  note = f"{title}: {'tree' if trees else 'k'}=auto"
  if c.tier_hist is not None and c.tier_hist.sum():
    shares = c.tier_hist / c.tier_hist.sum()
    mean = float(np.dot(shares, c.tiers))
    name = "{}-node tree" if trees else "k={}"
    note += " ran " + ", ".join(
      f"{name.format(k)} {s:.0%}" for k, s in zip(c.tiers, shares, strict=True)
    )
    note += f" of its steps (mean {'nodes' if trees else 'k'} {mean:.2f})"
  fast = [f for f in fixed_drafted(bc) if f.gate_passed and not math.isnan(f.mean["decode_tok_s"])]
  if fast and c.gate_passed and not math.isnan(c.mean["decode_tok_s"]):
    best = max(fast, key=lambda f: f.mean["decode_tok_s"])
    ratio = c.mean["decode_tok_s"] / best.mean["decode_tok_s"]
    note += f"; decode tok/s {ratio:.2f}× the fastest fixed k={best.k}"
  return note


def _knee_note(title: str, bc: list[Cell], threshold: float) -> str:
  drafted = [c for c in fixed_drafted(bc) if not math.isnan(c.mean["tau"])]
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
  drafted = [c for c in cells if c.k != 0]
  kmax = max((max(len(c.uncond), len(c.cond)) for c in drafted), default=0)
  constant, blocks = _split(drafted, ["k", "tree"], always_block=["method"])
  out = []
  for title, bc in blocks:
    rows = []
    for c in sorted(bc, key=k_order):
      for kind, curve in (("uncond", c.uncond), ("cond", c.cond)):
        vals = [_fmt(v, 3) for v in curve] + [""] * (kmax - len(curve))
        rows.append([k_label(c), _value(c, "tau", 2), kind, *vals])
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
        _value(c, "tau", 2),
        _value(c, "acceptance_rate", 3),
        _rate(c, "decode_tok_s"),
        _speedup(c),
      ]
      for c in sorted(bc, key=lambda c: c.conditions["prompt_tokens"])
    ]
    out.append((title, rows))
  return Table(
    "Context length",
    _caption(constant, cells, f"tok/s: decode-only rate; speedup vs no draft; {SPREAD_NOTE}"),
    ["prompt tokens", "τ", "acceptance", "decode tok/s", "speedup"],
    out,
    [],
  )


def _method_label(c: Cell) -> str:
  return f"{c.method} (k={c.k})" if c.tree is None else f"{c.method} (tree {c.tree})"


def method_workload(cells: list[Cell], baseline: str = DEFAULT_BASELINE) -> Table:
  """One table (EAGLE-3 Table 1): a row per method and k, a column group (speedup, tau) per
  workload and their mean; conditions that vary besides (temperature, ...) lead each row."""
  drafted = [c for c in cells if c.method != baseline]
  workloads = list(dict.fromkeys(c.conditions["workload"] for c in drafted))
  axes = ("method", "k", "tree", "drafter", "workload")
  lead = _varying(drafted, axes, always=())
  constant = {f: drafted[0].conditions[f] for f in AGG_FIELDS if f not in (*axes, *lead)}
  # Rows grouped by the leading conditions in the order the sweep wrote them, methods within.
  groups = list(dict.fromkeys(tuple(c.conditions[f] for f in lead) for c in drafted))
  by_row: dict[tuple, dict[str, Cell]] = {}
  for c in sorted(drafted, key=lambda c: groups.index(tuple(c.conditions[f] for f in lead))):
    key = (*(c.conditions[f] for f in lead), c.method, c.k, c.tree, c.conditions["drafter"])
    by_row.setdefault(key, {})[c.conditions["workload"]] = c
  # A method with several drafters (results of different sweeps) names the drafter too.
  drafters: dict[str, set] = {}
  for *_, method, _, _, drafter in by_row:
    drafters.setdefault(method, set()).add(drafter)
  rows = []
  for key, per_w in by_row.items():
    cs = [per_w.get(w) for w in workloads]
    present = [c for c in cs if c is not None]
    label = _method_label(present[0])
    if len(drafters[present[0].method]) > 1:
      label += f" [{present[0].conditions['drafter']}]"
    pairs = [_pair(c) for c in cs] + [_mean_pair(present)]
    rows.append([*map(str, key[: len(lead)]), label, *[x for pair in pairs for x in pair]])
  short = {"temperature": "T", "prompt_tokens": "prompt"}
  return Table(
    "Speedup and τ by method and workload",
    _caption(
      constant,
      drafted,
      "speedup: decode tok/s vs no draft on the same workload; Mean: over the row's workloads",
    ),
    [*(short.get(f, f) for f in lead), "method", *["speedup", "τ"] * (len(workloads) + 1)],
    [("", rows)],
    [],
    [("", len(lead) + 1), *[(w, 2) for w in workloads], ("Mean", 2)],
  )


def _pair(c: Cell | None) -> tuple[str, str]:
  if c is None:
    return "", ""
  return _speedup(c), _value(c, "tau", 2)


def _mean_pair(cs: list[Cell]) -> tuple[str, str]:
  tau = _fmt(float(np.nanmean([c.mean["tau"] for c in cs])), 2)
  if not all(c.speedup_gate for c in cs):
    return WITHHELD, tau
  sp = [c.speedup for c in cs if not math.isnan(c.speedup)]
  return (f"{np.mean(sp):.2f}×" if sp else "—"), tau


def concurrency(cells: list[Cell], baseline: str = DEFAULT_BASELINE) -> Table:
  """Whole-run tok/s (speedup) per batch size c1, c2, c4, ... and the mean tau (DFlash Table 3).

  Uses the whole-run rate, the throughput a server at that concurrency delivers; call
  attach_speedups with metric="whole_tok_s" first.
  """
  batches = sorted({c.conditions["batch"] for c in cells})
  constant, blocks = _split(cells, ["method", "k", "tree", "batch"])
  out = []
  for title, bc in blocks:
    by_method: dict[str, dict[int, Cell]] = {}
    for c in sorted(bc, key=lambda c: (c.method != baseline, c.method, k_order(c))):
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
      rows.append([label, *cols, _tau_over(list(per_b.values()))])
    out.append((title, rows))
  return Table(
    "Concurrency",
    _caption(
      constant,
      cells,
      f"cells: whole-run tok/s (speedup vs no draft); τ: over every batch size; {SPREAD_NOTE}",
    ),
    ["method", *[f"c{b}" for b in batches], "τ"],
    out,
    [],
  )


def _tau_over(cs: list[Cell]) -> str:
  """tau of every request of the cells together, with its interval; the mean of the cells' taus
  where some lack requests."""
  if all(c.requests for c in cs):
    tau, ci = _pooled("tau", [e for c in cs for e in c.requests.values()])
    return _with_ci(_fmt(tau, 2), ci, 2)
  return _fmt(float(np.nanmean([c.mean["tau"] for c in cs])), 2)


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


def _group_of_columns(t: Table) -> list[str]:
  """Each header column's group title ("" where none)."""
  return [title for title, n in t.groups for _ in range(n)] or [""] * len(t.header)


def to_markdown(t: Table) -> str:
  lines = [f"### {t.title}", "", t.caption, ""]
  align = "|" + "|".join(["---"] + ["---:"] * (len(t.header) - 1)) + "|"
  header = [f"{g} {h}" if g else h for g, h in zip(_group_of_columns(t), t.header, strict=True)]
  for title, rows in t.blocks:
    if title:
      lines += [f"**{title}**", ""]
    lines += ["| " + " | ".join(header) + " |", align]
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
  "[": "{[}",
  "]": "{]}",
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
  ]
  if t.groups:
    spans, rules, col = [], [], 1
    for title, n in t.groups:
      if title:
        spans.append(rf"\multicolumn{{{n}}}{{c}}{{{latex_escape(title)}}}")
        rules.append(rf"\cmidrule(lr){{{col}-{col + n - 1}}}")
      else:
        spans.append(" & " * (n - 1))  # n empty cells
      col += n
    lines += [" & ".join(spans) + r" \\", "".join(rules)]
  lines.append(" & ".join(latex_escape(h) for h in t.header) + r" \\")
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
  drafted = [c for c in cells if c.k != 0]
  varying = _varying(drafted, [], always=("method", "k"))
  return {_series_label(c, varying): (c.uncond, c.cond) for c in drafted}


def tau_vs_k_series(cells: list[Cell]) -> dict[str, dict[str, list]]:
  """{label: {"k", "tau", "decode_tok_s", "tau_ci", "decode_tok_s_ci"}} per method (and other
  varying conditions), by k; a *_ci entry is (lo, hi), (NaN, NaN) without an interval. k="auto"
  cells have no place on a k axis and are left out (`chosen_k_series` plots them), and so are
  static-tree cells, whose k is a depth, not the drafts a step verifies."""
  chains = [c for c in cells if not c.auto and c.tree is None]
  return _xy_series(chains, "k", ("tau", "decode_tok_s"))


def chosen_k_series(rows: Iterable[Mapping]) -> dict[str, dict[str, list]]:
  """{label: {"k": the k of each loop step, "tiers"}} per k="auto" cell: the trace of its first
  timed generate call (one request's decode at batch 1, a batch's shared choice otherwise) in
  its first run."""
  rows = [r for r in rows if r.get("k") == "auto"]
  cells = aggregate(rows)
  varying = _varying(cells, ["k"])
  out: dict[str, dict[str, list]] = {}
  for c in cells:
    key = tuple(c.conditions[f] for f in AGG_FIELDS)
    for r in rows:
      calls = (r.get("extra") or {}).get("calls", [])
      traces = [call["k_trace"] for call in calls if call.get("timed") and "k_trace" in call]
      if tuple(r.get(f) for f in AGG_FIELDS) == key and traces:
        out[_series_label(c, varying)] = {"k": traces[0], "tiers": list(r["tiers"])}
        break
  return out


def tau_vs_context_series(cells: list[Cell]) -> dict[str, dict[str, list]]:
  """{label: {"prompt_tokens", "tau", "acceptance_rate", and their *_ci}} per method and k."""
  return _xy_series(cells, "prompt_tokens", ("tau", "acceptance_rate"))


def _xy_series(cells: list[Cell], x: str, ys: Sequence[str]) -> dict[str, dict[str, list]]:
  varying = _varying(cells, [x])
  out: dict[str, dict[str, list]] = {}
  for c in sorted(cells, key=lambda c: c.conditions[x]):
    empty = {x: [], **{y: [] for y in ys}, **{f"{y}_ci": [] for y in ys}}
    s = out.setdefault(_series_label(c, varying), empty)
    s[x].append(c.conditions[x])
    for y in ys:
      ok = y not in ("decode_tok_s", "whole_tok_s") or c.gate_passed
      s[y].append(c.mean[y] if ok else math.nan)
      s[f"{y}_ci"].append(c.ci.get(y, NO_CI) if ok else NO_CI)
  return out
