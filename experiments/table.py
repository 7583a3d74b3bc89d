"""Print a paper-style table of one sweep or several and write its LaTeX and plots.

  python -m experiments.table --results=DIR/results.jsonl --layout=draft_budget [--out=DIR]
  python -m experiments.table --results='runs/*/results.jsonl' --layout=method_workload

--results takes paths and globs, comma-separated or the flag repeated; their rows make one table.
Markdown goes to stdout; OUT/table_<layout>.tex and the layout's PNG (if it has one) are written,
OUT defaulting to the first results file's directory.
"""

import glob

from absl import app, flags

from specdec.lab import tables
from specdec.lab.report import run

_RESULTS = flags.DEFINE_multi_string(
  "results",
  None,
  "sweeps' results.jsonl: paths or globs, comma-separated or repeated",
  required=True,
)
_LAYOUT = flags.DEFINE_enum("layout", "draft_budget", tables.LAYOUTS, "table layout")
_OUT = flags.DEFINE_string("out", None, "where .tex and .png go; default: beside --results")
_BASELINE = flags.DEFINE_string("baseline", tables.DEFAULT_BASELINE, "method speedups divide by")
_KNEE = flags.DEFINE_float("knee_threshold", 0.1, "tau gain per extra draft token below = knee")


def results_paths(patterns: list[str]) -> list[str]:
  """The files the --results patterns name, in the order given (a glob's matches sorted), each
  once; a pattern that matches no file (a missing path too) is an error naming it."""
  paths = []
  for pattern in (p.strip() for item in patterns for p in item.split(",") if p.strip()):
    matches = sorted(glob.glob(pattern, recursive=True))
    if not matches:
      raise app.UsageError(f"--results: no file matches {pattern!r}")
    paths += matches
  return list(dict.fromkeys(paths))


def main(argv):
  del argv
  paths = results_paths(_RESULTS.value)
  markdown, written = run(paths, _LAYOUT.value, _OUT.value, _BASELINE.value, _KNEE.value)
  print(markdown)
  for path in written:
    print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
