"""The plots' structure on sweep-shaped rows: panels per method, legends and colorbars outside the
data, positions from 1, no two labels on top of each other. No pixel comparisons."""

import itertools

import numpy as np
import pytest
from matplotlib.colors import to_hex

from specdec import metrics
from specdec.lab import plots, tables
from tests.helpers import result_row

DRAFTERS = {"ngram": "ngram", "draft_lm": "zoo:draft_lm", "mtp": "zoo:mtp"}
KS = (1, 2, 4, 8)


def _rows(contexts=(0,)):
  """Two legs of null plus every drafter at every k and context, with made-up counts."""
  rng = np.random.default_rng(0)
  rows = []
  for leg, ctx in itertools.product((0, 1), contexts):
    common = dict(seed=leg, leg=leg, prompt_tokens=ctx)
    hist = np.array([[12]])
    rows.append(_row("null", 0, "null", hist, 100.0, **common))
    for method, k in itertools.product(DRAFTERS, KS):
      hist = rng.integers(1, 10, size=(1, k + 1))
      rows.append(_row(method, k, DRAFTERS[method], hist, 100.0 + 20 * k - k * k, **common))
  return rows


def _row(method, k, drafter, hist, tok_s, **over):
  emitted = (hist * np.arange(1, k + 2)).sum(-1)
  summary = metrics.acceptance_summary(hist, 0 * hist, emitted)
  fields = dict(accept_hist=hist.tolist(), decode_tok_s=tok_s, **summary, **over)
  return result_row(method=method, k=k, drafter=drafter, **fields)


def _panels(fig):
  return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def _colorbars(fig):
  return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def _extent(artist, fig):
  return artist.get_window_extent(fig.canvas.get_renderer())


def _assert_outside(fig, artists):
  """No artist (legend, colorbar) overlaps any panel's data area."""
  for a, ax in itertools.product(artists, _panels(fig)):
    assert not _extent(a, fig).overlaps(_extent(ax.patch, fig)), (a, ax.get_title())


def _drawn_texts(fig):
  """Every text the figure draws: titles, axis labels, annotations, legend texts, and the tick
  labels inside the view (matplotlib keeps, but does not draw, labels of ticks beyond it)."""
  texts = [fig._suptitle] + [t for lg in fig.legends for t in lg.get_texts()]
  for ax in fig.axes:
    texts += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
    if ax.get_legend():
      texts += ax.get_legend().get_texts()
    for axis in (ax.xaxis, ax.yaxis):
      lo, hi = sorted(axis.get_view_interval())
      texts += [t.label1 for t in axis.get_major_ticks() if lo <= t.get_loc() <= hi]
  return [t for t in texts if t is not None and t.get_visible() and t.get_text().strip()]


def _assert_no_text_overlaps(fig):
  """No two texts the figure draws cover each other."""
  boxes = [(t.get_text(), _extent(t, fig)) for t in _drawn_texts(fig)]
  for (ta, a), (tb, b) in itertools.combinations(boxes, 2):
    assert not a.overlaps(b), (ta, tb)


def _draw(fig):
  from matplotlib.backends.backend_agg import FigureCanvasAgg

  FigureCanvasAgg(fig).draw()
  return fig


def test_per_position_one_panel_per_method_coloured_by_k():
  fig = _draw(plots.per_position_figure(tables.per_position_series(tables.aggregate(_rows()))))
  panels = _panels(fig)
  assert [ax.get_title() for ax in panels] == list(DRAFTERS)  # drafter=zoo:mtp echoes the method
  for ax in panels:
    lines = ax.get_lines()
    assert len(lines) == 2 * len(KS)  # unconditional and conditional per k
    assert {ln.get_linestyle() for ln in lines} == {"-", "--"}
    assert len({tuple(ln.get_color()) for ln in lines}) == len(KS)
    # Positions are numbered from 1: the first tick is 1, and the k=8 curves end at 8.
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks[0] == 1 and max(ticks) == max(KS)
    assert min(ln.get_xdata()[0] for ln in lines) == 1
    assert max(ln.get_xdata()[-1] for ln in lines) == max(KS)
  (bar,) = _colorbars(fig)
  assert [t.get_text() for t in bar.get_yticklabels()] == [str(k) for k in KS]
  _assert_outside(fig, [bar, *fig.legends])
  _assert_no_text_overlaps(fig)


def test_per_position_panel_per_method_and_context():
  cells = tables.aggregate(_rows(contexts=(128, 256)))
  fig = _draw(plots.per_position_figure(tables.per_position_series(cells)))
  titles = sorted(ax.get_title() for ax in _panels(fig))
  assert titles == sorted(f"{m}, prompt={c}" for m in DRAFTERS for c in (128, 256))
  assert len({ax.get_position().y0 for ax in _panels(fig)}) == 2  # 6 panels, rows of 4
  _assert_no_text_overlaps(fig)


def test_tau_vs_k_legend_on_both_panels_outside_with_knee_and_fastest():
  fig = _draw(plots.tau_vs_k_figure(tables.tau_vs_k_series(tables.aggregate(_rows()))))
  tau_ax, speed_ax = _panels(fig)
  for ax, word in ((tau_ax, "knee k="), (speed_ax, "fastest k=")):
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[0] == "null (k=0)"
    assert all(word in lab for lab in labels[1:]) and len(labels) == 1 + len(DRAFTERS)
    _assert_outside(fig, [legend])
  assert [t.get_text() for t in tau_ax.get_xticklabels()] == [str(k) for k in KS]
  assert not tau_ax.texts and not speed_ax.texts  # knees are in the legend, not annotations
  _assert_no_text_overlaps(fig)


def test_tau_vs_k_a_row_per_context():
  cells = tables.aggregate(_rows(contexts=(128, 256)))
  fig = _draw(plots.tau_vs_k_figure(tables.tau_vs_k_series(cells)))
  titles = [ax.get_title() for ax in _panels(fig)]
  assert titles == [
    "τ vs k — prompt=128",
    "decode tok/s vs k — prompt=128",
    "τ vs k — prompt=256",
    "decode tok/s vs k — prompt=256",
  ]
  # A method keeps its colour from row to row.
  colours = [
    {t.get_text().split(" ")[0]: to_hex(h.get_color()) for t, h in _legend_items(ax)}
    for ax in _panels(fig)
  ]
  assert all(c == colours[0] for c in colours)
  _assert_outside(fig, [ax.get_legend() for ax in _panels(fig)])
  _assert_no_text_overlaps(fig)


def _legend_items(ax):
  legend = ax.get_legend()
  return zip(legend.get_texts(), legend.legend_handles, strict=True)


def test_tau_vs_context_one_panel_per_method_without_the_baseline():
  cells = tables.aggregate(_rows(contexts=(128, 256, 512)))
  fig = _draw(plots.tau_vs_context_figure(tables.tau_vs_context_series(cells)))
  panels = _panels(fig)
  assert [ax.get_title() for ax in panels] == list(DRAFTERS)  # null's tau is 1 by definition
  assert all(len(ax.containers) == len(KS) for ax in panels)  # an errorbar series per k
  assert [t.get_text() for t in panels[0].get_xticklabels()] == ["128", "256", "512"]
  _assert_outside(fig, _colorbars(fig))
  _assert_no_text_overlaps(fig)


@pytest.mark.parametrize(
  "write, series",
  [
    (plots.per_position, tables.per_position_series),
    (plots.tau_vs_k, tables.tau_vs_k_series),
    (plots.tau_vs_context, tables.tau_vs_context_series),
  ],
)
def test_writers_save_png_also_with_nothing_to_draw(tmp_path, write, series):
  path = write(series(tables.aggregate(_rows())), tmp_path / "sub" / "a.png")
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  null_only = [r for r in _rows() if r["method"] == "null"]
  assert write(series(tables.aggregate(null_only)), tmp_path / "b.png").exists()


def test_long_panel_titles_break_between_fields():
  assert plots._wrapped("mtp, prompt=512") == "mtp, prompt=512"
  assert (
    plots._wrapped("ngram, prompt=128, target=zoo:target")
    == "ngram, prompt=128,\ntarget=zoo:target"
  )
