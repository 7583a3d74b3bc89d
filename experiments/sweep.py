"""The main job: a draft-budget x context-length sweep from an ml_collections config.

python -m experiments.sweep [--config=configs/default.py] [--config.ks=1,2,4] --out=runs/default
python -m experiments.sweep --config=configs/trees.py --out=runs/trees  # static trees beside chains

Spread over N processes (one per GPU, or CPU processes), each started with the same flags and its
own --process_id, all appending to the one --out (specdec.lab.processes):
python -m experiments.sweep --num_processes=2 --process_id=0 --coordinator=host:port ...
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from specdec import xla_env
from specdec.checkpoint.safetensors_io import CheckpointError
from specdec.lab import driver, report
from specdec.lab.processes import Processes, distributed
from specdec.lab.results import ResultsError
from specdec.lab.sweep import SweepError

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "sweep config file")
_OUT = flags.DEFINE_string("out", "runs/default", "results directory (a re-run resumes it)")
_PLOTS = flags.DEFINE_bool("plots", True, "write the tables' LaTeX and PNG plots into --out")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 1, "processes sharing the sweep")
_PROCESS_ID = flags.DEFINE_integer("process_id", 0, "this process's index in [0, num_processes)")
_COORDINATOR = flags.DEFINE_string(
  "coordinator", "localhost:12355", "jax.distributed coordinator address (host:port of process 0)"
)
_WORKERS = flags.DEFINE_integer(
  "compile_workers", None, "threads compiling the cells ahead (default: the host's cores; 0: none)"
)


def main(argv):
  del argv
  xla_env.apply_defaults()
  try:
    procs = Processes()
    if _NUM_PROCESSES.value > 1:
      driver.check_process_count(_CONFIG.value, _NUM_PROCESSES.value)
      procs = distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    table = driver.run(_CONFIG.value, _OUT.value, compile_workers=_WORKERS.value, processes=procs)
  except (SweepError, ResultsError, CheckpointError) as e:
    sys.exit(f"sweep: {e}")  # one line, exit status 1: the flag, the value, what is allowed
  if procs.count > 1:
    import jax

    jax.distributed.shutdown()  # a barrier: every process has appended its rows
    if procs.index:
      return
    table = driver.table(_OUT.value)  # every process's rows
  print(table)
  if _PLOTS.value:
    for layout in ("draft_budget", "per_position", "context"):
      _, written = report.run(f"{_OUT.value}/results.jsonl", layout)
      print("wrote", ", ".join(str(p) for p in written))


if __name__ == "__main__":
  app.run(main)
