"""PNG plots of the acceptance curves, the draft-budget knee, and tau against context length.

Figures are built on matplotlib's Agg canvas directly (no pyplot), so plotting needs no display,
changes no global backend, and leaves no open figures behind in a long notebook or sweep. Each plot
has a `*_figure` builder (a notebook shows it with `png`) and a writer that saves it. Error bars are
the series' bootstrap intervals over requests (`*_ci`, tables._xy_series); a point without one
(rows from before per-request data) is drawn bare.

Series labels are the tables' "field=value, ..." strings (tables._cond_str). Plots with many
series draw small multiples: one panel per method (and any other varying condition), colour by k
on a discrete colorbar, every legend outside the data area.
"""

import io
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator

from specdec import metrics

CI_NOTE = (
  f"bars: {100 * metrics.CI_LEVEL:.0f}% bootstrap CI over requests "
  f"({metrics.CI_RESAMPLES} resamples)"
)
TAU_LABEL = "τ (tokens per target forward)"
K_LABEL = "k (draft tokens per step)"
AUTO = "auto"  # the k of a cell whose budget is chosen per step (specdec.decoding.budget)
PANELS_PER_ROW = 4
UNCOND_LABEL = "unconditional: drafts 1..i all accepted"
COND_LABEL = "conditional: draft i accepted | drafts 1..i-1 accepted"
TREES_LEFT_OUT = "static-tree cells left out (their k is a depth): see the draft-budget table"


def png(fig: Figure) -> bytes:
  """The figure as PNG bytes, rendered as `_save` writes it (for IPython.display.Image)."""
  buf = io.BytesIO()
  FigureCanvasAgg(fig)
  fig.savefig(buf, format="png", dpi=150, bbox_inches="tight")
  return buf.getvalue()


def _save(fig: Figure, path: str | Path) -> Path:
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(png(fig))
  return path


# --- labels, panels, colours ----------------------------------------------------------------------


def _conditions(label: str) -> dict[str, str]:
  """{field: value} of a "field=value, ..." label; any other label is one field named ""."""
  parts = [p.partition("=") for p in label.split(", ")]
  if not all(sep for _, sep, _ in parts):
    return {"": label}
  return {f: v for f, _, v in parts}


def _name(conds: Mapping[str, str]) -> str:
  """A short name: the method's value, then the other fields as field=value. A drafter named
  after its method (`ngram`, `zoo:mtp`) says nothing the method does not, so it is left out."""
  method = conds.get("method")
  rest = [
    f"{f}={v}" if f else v
    for f, v in conds.items()
    if f != "method" and not (f == "drafter" and method and v.split(":")[-1] == method)
  ]
  return ", ".join(([method] if method else []) + rest)


def _wrapped(name: str, width: int = 30) -> str:
  """A panel title broken between its fields into lines of about `width` characters."""
  lines: list[str] = []
  for field in name.split(", "):
    if lines and len(lines[-1]) + 2 + len(field) <= width:
      lines[-1] += ", " + field
    else:
      lines.append(field)
  return ",\n".join(lines)


def _group(labels, inner: tuple[str, ...]) -> dict[str, list[tuple[str, dict[str, str]]]]:
  """{group name: [(label, its `inner` fields)]}: the labels grouped by every field not in `inner`,
  in first-seen order (a group is a panel or a row; `inner` tells its series apart)."""
  groups: dict[str, list[tuple[str, dict[str, str]]]] = {}
  for label in labels:
    conds = _conditions(label)
    own = {f: conds.pop(f) for f in inner if f in conds}
    groups.setdefault(_name(conds), []).append((label, own))
  return groups


def _small_multiples(n: int, xlabel: str, ylabel: str, size: tuple[float, float]):
  """(figure, n axes of `size` inches in even rows of at most PANELS_PER_ROW, sharing both axes,
  each axis labelled on the outer panels only, columns); no axes when n = 0, the figure says so."""
  nrows = max(1, math.ceil(n / PANELS_PER_ROW))
  ncols = max(1, math.ceil(n / nrows))  # rows as even as can be: 6 panels are 2 x 3, not 4 + 2
  # The extra width and height hold the colorbar and the legend above the panels.
  fig = Figure(figsize=(size[0] * ncols + 1.3, size[1] * nrows + 0.8), layout="constrained")
  if n == 0:
    fig.text(0.5, 0.5, "no drafted cells", ha="center")
    return fig, [], ncols
  axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False).ravel()
  for ax in axes[n:]:
    fig.delaxes(ax)
  for i, ax in enumerate(axes[:n]):
    # Shared axes hide inner tick labels; a panel with no panel below it keeps its x labels.
    ax.xaxis.set_tick_params(labelbottom=i + ncols >= n)
    ax.set_xlabel(xlabel if i + ncols >= n else "")
    ax.set_ylabel(ylabel if i % ncols == 0 else "")
    ax.grid(alpha=0.3)
  return fig, list(axes[:n]), ncols


def _k_colours(ks) -> tuple[dict[int, tuple], ScalarMappable]:
  """One colour per distinct k (viridis without its pale end), and a mappable for a colorbar
  with one band per k."""
  ks = sorted(set(ks))
  colours = colormaps["viridis"](np.linspace(0.0, 0.85, len(ks)))
  norm = BoundaryNorm(np.arange(len(ks) + 1) - 0.5, len(ks))
  mappable = ScalarMappable(norm=norm, cmap=ListedColormap(colours))
  return {k: tuple(c) for k, c in zip(ks, colours, strict=True)}, mappable


def _k_colorbar(fig: Figure, axes, ks, mappable: ScalarMappable) -> None:
  ks = sorted(set(ks))
  bar = fig.colorbar(mappable, ax=axes, ticks=range(len(ks)), aspect=30, pad=0.02)
  bar.ax.set_yticklabels([str(k) for k in ks])
  bar.set_label(K_LABEL)


def _has_ci(series: Mapping, y: str) -> bool:
  return any(not math.isnan(lo) for s in series.values() for lo, _ in s.get(f"{y}_ci", []))


def _yerr(values, cis) -> np.ndarray:
  """[2, n] distances below and above each value for errorbar; NaN where there is no interval."""
  v = np.asarray(values, dtype=np.float64)
  ci = np.asarray(cis, dtype=np.float64).reshape(-1, 2)
  return np.clip(np.stack([v - ci[:, 0], ci[:, 1] - v]), 0.0, None)


def _plot(ax, x, s: Mapping, y: str, **kw):
  """The series' y against x with its interval as error bars; returns the line."""
  cis = s.get(f"{y}_ci", [(math.nan, math.nan)] * len(x))
  kw = {"marker": "o", "markersize": 4, "capsize": 3, **kw}
  return ax.errorbar(x, s[y], yerr=_yerr(s[y], cis), **kw).lines[0]


def _ticks_at(ax, values, log2: bool) -> None:
  """x ticks at exactly the measured values, on a log2 axis if asked ("as is" for a length 0)."""
  if log2:
    ax.set_xscale("log", base=2)
  ax.xaxis.set_major_locator(FixedLocator(sorted(set(values))))
  ax.xaxis.set_major_formatter(lambda v, _: f"{v:g}" if v else "as is")
  ax.xaxis.set_minor_locator(NullLocator())


def _position_ticks(n: int) -> list[int]:
  """Draft positions to tick, numbered from 1: every one up to 8, else 1 and even steps."""
  if n <= 8:
    return list(range(1, n + 1))
  step = math.ceil(n / 4)
  return [1, *range(step, n + 1, step)]


# --- per-position acceptance ----------------------------------------------------------------------


def per_position_figure(series: Mapping[str, tuple]) -> Figure:
  """Per-position acceptance, one panel per method: the unconditional curve solid, the
  conditional one dashed, colour by k (a series' k is its curve's length)."""
  panels = _group(series, inner=("k",))
  ks = [len(uncond) for uncond, _ in series.values()]
  fig, axes, _ = _small_multiples(len(panels), "draft position", "acceptance", (2.9, 2.5))
  if not axes:
    return fig
  colour, mappable = _k_colours(ks)
  for ax, (name, members) in zip(axes, panels.items(), strict=True):
    for label, _ in members:
      uncond, cond = (np.asarray(c, dtype=np.float64) for c in series[label])
      pos = np.arange(1, len(uncond) + 1)
      c = colour[len(uncond)]
      # Unconditional on top: at position 1 the two are equal and its filled marker shows.
      ax.plot(pos, cond, "--o", color=c, markersize=3, mfc="white", lw=1)
      ax.plot(pos, uncond, "-o", color=c, markersize=3)
    ax.set_title(_wrapped(name), fontsize="medium")
  kmax = max(ks)
  axes[0].set_xlim(0.5, kmax + 0.5)
  axes[0].xaxis.set_major_locator(FixedLocator(_position_ticks(kmax)))
  axes[0].set_ylim(-0.03, 1.03)  # a 0 (never accepted) stays visible above the frame
  _k_colorbar(fig, axes, ks, mappable)
  styles = [
    Line2D([], [], color="0.3", ls="-", marker="o", ms=3, label=UNCOND_LABEL),
    Line2D([], [], color="0.3", ls="--", marker="o", ms=3, mfc="white", lw=1, label=COND_LABEL),
  ]
  fig.legend(handles=styles, loc="outside upper center", ncols=2, fontsize="small", frameon=False)
  return fig


def per_position(series: Mapping[str, tuple], path: str | Path) -> Path:
  """per_position_figure written to `path`."""
  return _save(per_position_figure(series), path)


# --- draft budget -------------------------------------------------------------------------------


def tau_vs_k_figure(
  series: Mapping[str, Mapping], knee_threshold: float = 0.1, trees_left_out: bool = False
) -> Figure:
  """tau against k with the knee (metrics.tau_knee) marked; decode tok/s beside it when measured.

  The knee is where the next draft token stops adding `knee_threshold` tau; the square on the speed
  panel marks the k with the highest decode tok/s (metrics.best_k), the device's own optimum. One
  row of panels per setting of the conditions other than the method (e.g. per context length),
  a colour per method throughout; each panel's legend, to its right, names the series with its
  knee or fastest k. A series measured at k = 0 only (the no-draft arm) is a dotted horizontal line
  with its interval as a band; drafted series are nudged apart along the log2 k axis so their
  error bars do not cover each other. Static-tree cells have no place on a k axis
  (tables.tau_vs_k_series leaves them out); trees_left_out says so in the title.
  """
  has_speed = any(
    not all(map(math.isnan, s.get("decode_tok_s", [math.nan]))) for s in series.values()
  )
  ys = ["tau", "decode_tok_s"] if has_speed else ["tau"]
  rows = _group(series, inner=("method", "drafter"))
  names = list(dict.fromkeys(_name(own) for members in rows.values() for _, own in members))
  fig = Figure(figsize=(6.8 * len(ys), 3.3 * len(rows) + 0.4), layout="constrained")
  grid = fig.subplots(len(rows), len(ys), sharex=True, sharey="col", squeeze=False)
  drafted_ks = [k for s in series.values() for k in s["k"] if k > 0]
  for axes, (row, members) in zip(grid, rows.items(), strict=True):
    drafted = [label for label, _ in members if any(k > 0 for k in series[label]["k"])]
    for label, own in members:
      s, name = series[label], _name(own)
      colour = f"C{names.index(name) % 10}"
      if label not in drafted:
        for ax, y in zip(axes, ys, strict=True):
          _baseline(ax, s, y, f"{name} (k=0)", colour)
        continue
      nudge = 2.0 ** (0.04 * (drafted.index(label) - (len(drafted) - 1) / 2))
      ks = list(s["k"])
      x = [k * nudge for k in ks]
      measured = [(k, t) for k, t in zip(ks, s["tau"], strict=True) if k > 0 and not math.isnan(t)]
      tau_name = name
      if len(measured) >= 2:
        knee = metrics.tau_knee(*zip(*measured, strict=True), threshold=knee_threshold)
        axes[0].plot([knee * nudge], [dict(measured)[knee]], "*", ms=15, color=colour, mec="white")
        tau_name = f"{name} (knee k={knee})"
      _plot(axes[0], x, s, "tau", color=colour, label=tau_name)
      if has_speed:
        speed = list(s.get("decode_tok_s", [math.nan] * len(ks)))
        speed_name = name
        if sum(not math.isnan(v) for v in speed) >= 2:
          best = metrics.best_k(ks, speed)
          axes[1].plot(
            [best * nudge], [speed[ks.index(best)]], "s", ms=11, mfc="none", color=colour
          )
          speed_name = f"{name} (fastest k={best})"
        speed_s = {**s, "decode_tok_s": speed}
        _plot(axes[1], x, speed_s, "decode_tok_s", color=colour, label=speed_name)
    suffix = f" — {row}" if row else ""
    axes[0].set_ylabel(TAU_LABEL)
    axes[0].set_title(f"τ vs k{suffix}", fontsize="medium")
    if has_speed:
      axes[1].set_ylabel("decode tok/s")
      axes[1].set_title(f"decode tok/s vs k{suffix}", fontsize="medium")
    for ax in axes:
      ax.grid(alpha=0.3)
      ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small", frameon=False)
  for ax in grid[-1]:
    ax.set_xlabel(K_LABEL)
  if drafted_ks:
    _ticks_at(grid[0][0], drafted_ks, log2=True)
  note = f"★ τ knee: next gain < {knee_threshold} τ per draft token; □ fastest k"
  if _has_ci(series, "tau") or _has_ci(series, "decode_tok_s"):
    note += f"; {CI_NOTE}"
  if trees_left_out:
    note += f"; {TREES_LEFT_OUT}"
  fig.suptitle(note, fontsize="small")
  return fig


def _baseline(ax, s: Mapping, y: str, label: str, colour: str) -> None:
  """A k = 0 series' value as a dotted horizontal line, its interval as a band."""
  value = s.get(y, [math.nan])[0]
  if math.isnan(value):
    return
  ax.axhline(value, color=colour, ls=":", lw=1.5, label=label)
  lo, hi = s.get(f"{y}_ci", [(math.nan, math.nan)])[0]
  if not math.isnan(lo):
    ax.axhspan(lo, hi, color=colour, alpha=0.12, lw=0)


def tau_vs_k(
  series: Mapping[str, Mapping], path: str | Path, knee_threshold: float = 0.1,
  trees_left_out: bool = False,
) -> Path:  # fmt: skip
  """tau_vs_k_figure written to `path`."""
  return _save(tau_vs_k_figure(series, knee_threshold, trees_left_out), path)


# --- context ------------------------------------------------------------------------------------


def tau_vs_context_figure(series: Mapping[str, Mapping]) -> Figure:
  """tau against prompt length, one panel per method, colour by k (log2 axis where every length is
  given; 0 means prompts as they are). The no-draft arm (k=0, tau = 1 by definition) is left out."""
  labels = [label for label in series if _conditions(label).get("k") != "0"]
  panels = _group(labels, inner=("k",))
  fig, axes, _ = _small_multiples(len(panels), "prompt tokens", "τ", (2.9, 2.6))
  if not axes:
    return fig
  # Without k in the labels (one k in the sweep) every line is one colour and there is no colorbar.
  # k="auto" lines are black and dashed, beside the colours of the fixed k.
  fixed = [own["k"] for members in panels.values() for _, own in members if "k" in own]
  ks = [int(k) for k in fixed if k != AUTO]
  colour, mappable = _k_colours(ks) if ks else ({}, None)
  for ax, (name, members) in zip(axes, panels.items(), strict=True):
    for label, own in members:
      s, k = series[label], own.get("k", "0")
      style = dict(color="k", ls="--") if k == AUTO else dict(color=colour.get(int(k), "C0"))
      _plot(ax, s["prompt_tokens"], s, "tau", **style)
    ax.set_title(name, fontsize="medium")
  xs = [x for label in labels for x in series[label]["prompt_tokens"]]
  _ticks_at(axes[0], xs, log2=min(xs) > 0)
  if ks:
    _k_colorbar(fig, axes, ks, mappable)
  title = "τ (tokens per target forward) vs context length"
  if _has_ci(series, "tau"):
    title += f"; {CI_NOTE}"
  fig.suptitle(title, fontsize="medium")
  return fig


def tau_vs_context(series: Mapping[str, Mapping], path: str | Path) -> Path:
  """tau_vs_context_figure written to `path`."""
  return _save(tau_vs_context_figure(series), path)


# --- the chosen draft budget ----------------------------------------------------------------------


def chosen_k_figure(series: Mapping[str, Mapping]) -> Figure:
  """k="auto" and tree="auto": the k (a tree tier's drafted nodes) chosen at each step of a
  request, one panel per cell (tables.chosen_k_series), a step line on a log2 axis ticked at the
  cell's tiers."""
  fig, axes, _ = _small_multiples(len(series), "step of the request", K_LABEL, (2.9, 2.3))
  for ax, (label, s) in zip(axes, series.items(), strict=True):
    steps = np.arange(1, len(s["k"]) + 1)
    ax.step(steps, s["k"], where="post", color="C0")
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_locator(FixedLocator(s["tiers"]))
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylim(min(s["tiers"]) / 1.3, max(s["tiers"]) * 1.3)
    ax.set_title(_name(_conditions(label)), fontsize="medium")
  fig.suptitle(
    "k='auto' / tree='auto': the draft budget (a tree's: its drafted nodes) chosen on the device "
    "before each step",
    fontsize="medium",
  )
  return fig


def chosen_k(series: Mapping[str, Mapping], path: str | Path) -> Path:
  """chosen_k_figure written to `path`."""
  return _save(chosen_k_figure(series), path)
