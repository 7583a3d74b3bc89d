"""The main job: a draft-budget x context-length sweep from an ml_collections config.

python -m experiments.sweep [--config=configs/default.py] [--config.ks=1,2,4] --out=runs/default
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from specdec import xla_env
from specdec.checkpoint.safetensors_io import CheckpointError
from specdec.lab import driver, report
from specdec.lab.results import ResultsError
from specdec.lab.sweep import SweepError

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "sweep config file")
_OUT = flags.DEFINE_string("out", "runs/default", "results directory (a re-run resumes it)")
_PLOTS = flags.DEFINE_bool("plots", True, "write the tables' LaTeX and PNG plots into --out")
_WORKERS = flags.DEFINE_integer(
  "compile_workers", None, "threads compiling the cells ahead (default: the host's cores; 0: none)"
)


def main(argv):
  del argv
  xla_env.apply_defaults()
  try:
    print(driver.run(_CONFIG.value, _OUT.value, compile_workers=_WORKERS.value))
  except (SweepError, ResultsError, CheckpointError) as e:
    sys.exit(f"sweep: {e}")  # one line, exit status 1: the flag, the value, what is allowed
  if _PLOTS.value:
    for layout in ("draft_budget", "per_position", "context"):
      _, written = report.run(f"{_OUT.value}/results.jsonl", layout)
      print("wrote", ", ".join(str(p) for p in written))


if __name__ == "__main__":
  app.run(main)
