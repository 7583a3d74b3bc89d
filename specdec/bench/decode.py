"""The decode benchmark (experiments/bench_decode.py): decode speed of large random targets and what
bounds it (issue 9). This driver runs the configured parts in order under a wall-clock budget and
appends each row to results.jsonl as soon as it is measured; one failing or skipped cell is a row
saying so, never the end of the run.

The benchmark by job:
  decode_config    the part names and `validate`: every config problem, before anything compiles
  decode_parts     each `--config.parts` entry: the cells it runs and the conditions of their rows
  decode_cells     the measurements: copy ceiling, decode, verify, profile, loop overhead, compile
  attention_impls  the attention implementations the attention part compares, and its cell
  hlo_copies       the copies in an optimized HLO module (the loop part's census)
  decode_child     cells run in a fresh process (own XLA_FLAGS, own compilation cache), and how
  decode_report    the Markdown tables
  random_models    random targets and synthetic decode states (speed does not depend on values)
"""

import json
import math
import time
from pathlib import Path

from specdec.bench import decode_parts
from specdec.bench.decode_config import parse_parts
from specdec.lab.results import append_row, environment_fields


class Budget:
  """Wall seconds left for the run; 0 means no limit."""

  def __init__(self, seconds: float):
    self.seconds = seconds
    self.start = time.perf_counter()

  def left(self) -> float:
    return math.inf if not self.seconds else self.seconds - (time.perf_counter() - self.start)


class Runner:
  """Runs the parts in order, appending each row to results.jsonl as soon as it is measured."""

  def __init__(self, cfg, out_dir: str):
    self.cfg = cfg
    self.out = Path(out_dir)
    self.out.mkdir(parents=True, exist_ok=True)
    self.budget = Budget(cfg.budget_s)
    self.rows: list[dict] = []
    self.env = environment_fields()
    self.copy_tbs = None  # this run's copy ceiling, once the copy part has measured it

  def emit(self, row: dict) -> None:
    # A row's own fields win: a flags arm's `attention` is its child's, not this process's.
    row = append_row(self.out / "results.jsonl", {**self.env, **row}, validate=False)
    self.rows.append(row)
    print(json.dumps(row), flush=True)

  def guarded(self, conditions: dict, measure, *args) -> None:
    """One cell: its row, or a row saying it was skipped (budget) or failed (the error)."""
    if self.budget.left() <= 0:
      self.emit({**conditions, "skipped": "time budget spent"})
      return
    try:
      self.emit({**conditions, **measure(*args)})
    except Exception as e:  # one failing cell (say cuDNN refusing a shape) must not end the run
      self.emit({**conditions, "error": f"{type(e).__name__}: {e}"[:2000]})

  def run(self) -> list[dict]:
    for part, fmts in parse_parts(self.cfg.parts):
      decode_parts.BY_NAME[part](self, *([fmts] if part == "decode" else []))
    return self.rows
