"""PNG plots of the acceptance curves, the draft-budget knee, and tau against context length.

Figures are built on matplotlib's Agg canvas directly (no pyplot), so plotting needs no display,
changes no global backend, and leaves no open figures behind in a long notebook or sweep. Error
bars are the series' bootstrap intervals over requests (`*_ci`, tables._xy_series); a point without
one (rows from before per-request data) is drawn bare.
"""

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from specdec import metrics

CI_NOTE = (
  f"bars: {100 * metrics.CI_LEVEL:.0f}% bootstrap CI over requests "
  f"({metrics.CI_RESAMPLES} resamples)"
)


def _save(fig: Figure, path: str | Path) -> Path:
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  FigureCanvasAgg(fig)
  fig.savefig(path, dpi=150, bbox_inches="tight")
  return path


def _yerr(values, cis) -> np.ndarray:
  """[2, n] distances below and above each value for errorbar; NaN where there is no interval."""
  v = np.asarray(values, dtype=np.float64)
  ci = np.asarray(cis, dtype=np.float64).reshape(-1, 2)
  return np.clip(np.stack([v - ci[:, 0], ci[:, 1] - v]), 0.0, None)


def _plot(ax, x, s: Mapping, y: str, **kw):
  """The series' y against x with its interval as error bars; returns the line."""
  cis = s.get(f"{y}_ci", [(math.nan, math.nan)] * len(x))
  return ax.errorbar(x, s[y], yerr=_yerr(s[y], cis), marker="o", capsize=3, **kw).lines[0]


def _legend(ax, series: Mapping, y: str) -> None:
  """The legend, titled with what the error bars are where any series has one."""
  bars = any(not math.isnan(lo) for s in series.values() for lo, _ in s.get(f"{y}_ci", []))
  ax.legend(fontsize="small", title=CI_NOTE if bars else None, title_fontsize="small")


def per_position(series: Mapping[str, tuple], path: str | Path) -> Path:
  """Unconditional and conditional acceptance by draft position, one line per series."""
  fig = Figure(figsize=(10, 4))
  ax_u, ax_c = fig.subplots(1, 2, sharey=True)
  for label, (uncond, cond) in series.items():
    pos = np.arange(len(uncond))
    ax_u.plot(pos, uncond, marker="o", label=label)
    ax_c.plot(pos, cond, marker="o", label=label)
  ax_u.set_title("unconditional: P(first i+1 drafts accepted)")
  ax_c.set_title("conditional: P(i accepted | < i accepted)")
  for ax in (ax_u, ax_c):
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("draft position i")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
  ax_u.set_ylabel("acceptance")
  ax_c.legend(fontsize="small")
  return _save(fig, path)


def tau_vs_k(series: Mapping[str, Mapping], path: str | Path, knee_threshold: float = 0.1) -> Path:
  """tau against k with the knee (metrics.tau_knee) marked; decode tok/s beside it when measured.

  The knee is where the next draft token stops adding `knee_threshold` tau; the square on the speed
  panel marks the k with the highest decode tok/s (metrics.best_k), the device's own optimum.
  """
  has_speed = any(
    not all(map(math.isnan, s.get("decode_tok_s", [math.nan]))) for s in series.values()
  )
  fig = Figure(figsize=(10 if has_speed else 5, 4))
  axes = fig.subplots(1, 2 if has_speed else 1, squeeze=False)[0]
  for label, s in series.items():
    ks, taus = list(s["k"]), list(s["tau"])
    line = _plot(axes[0], ks, s, "tau", label=label)
    measured = [(k, t) for k, t in zip(ks, taus, strict=True) if k > 0 and not math.isnan(t)]
    if len(measured) >= 2:
      knee = metrics.tau_knee(*zip(*measured, strict=True), threshold=knee_threshold)
      axes[0].plot(
        [knee], [dict(measured)[knee]], marker="*", markersize=16, color=line.get_color(), ls=""
      )
      axes[0].annotate(
        f"knee k={knee}",
        (knee, dict(measured)[knee]),
        textcoords="offset points",
        xytext=(0, -20),
        ha="center",
        fontsize="small",
      )
    if has_speed:
      speed = list(s.get("decode_tok_s", [math.nan] * len(ks)))
      _plot(axes[1], ks, {**s, "decode_tok_s": speed}, "decode_tok_s", color=line.get_color())
      if sum(not math.isnan(v) for v in speed) >= 2:
        best = metrics.best_k(ks, speed)
        axes[1].plot(
          [best],
          [speed[ks.index(best)]],
          marker="s",
          markersize=10,
          ls="",
          mfc="none",
          color=line.get_color(),
        )
  axes[0].set_xlabel("k (draft tokens per step)")
  axes[0].set_ylabel("τ (tokens per target forward)")
  axes[0].set_title(f"τ vs k (★ knee: next gain < {knee_threshold} τ/token)")
  _legend(axes[0], series, "tau")
  if has_speed:
    axes[1].set_xlabel("k (draft tokens per step)")
    axes[1].set_ylabel("decode tok/s")
    axes[1].set_title("decode tok/s vs k (□ fastest)")
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  return _save(fig, path)


def tau_vs_context(series: Mapping[str, Mapping], path: str | Path) -> Path:
  """tau against prompt length (log2 axis), one line per method and k."""
  fig = Figure(figsize=(5, 4))
  ax = fig.subplots()
  for label, s in series.items():
    _plot(ax, s["prompt_tokens"], s, "tau", label=label)
  if series and all(min(s["prompt_tokens"], default=0) > 0 for s in series.values()):
    ax.set_xscale("log", base=2)
  ax.set_xlabel("prompt tokens")
  ax.set_ylabel("τ (tokens per target forward)")
  ax.set_title("τ vs context length")
  ax.grid(alpha=0.3)
  _legend(ax, series, "tau")
  return _save(fig, path)
