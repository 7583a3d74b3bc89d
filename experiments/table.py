"""Print a paper-style table of a sweep and write its LaTeX and plots.

  python -m experiments.table --results=DIR/results.jsonl --layout=draft_budget [--out=DIR]

Markdown goes to stdout; OUT/table_<layout>.tex and the layout's PNG (if it has one) are written,
OUT defaulting to the results file's directory.
"""

from absl import app, flags

from specdec.lab import tables
from specdec.lab.report import run

_RESULTS = flags.DEFINE_string("results", None, "path of a sweep's results.jsonl", required=True)
_LAYOUT = flags.DEFINE_enum("layout", "draft_budget", tables.LAYOUTS, "table layout")
_OUT = flags.DEFINE_string("out", None, "where .tex and .png go; default: beside --results")
_BASELINE = flags.DEFINE_string("baseline", tables.DEFAULT_BASELINE, "method speedups divide by")
_KNEE = flags.DEFINE_float("knee_threshold", 0.1, "tau gain per extra draft token below = knee")


def main(argv):
  del argv
  markdown, written = run(_RESULTS.value, _LAYOUT.value, _OUT.value, _BASELINE.value, _KNEE.value)
  print(markdown)
  for path in written:
    print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
