"""Drives a sweep end to end: check everything, load once, run missing (cell, leg)s, report."""

import dataclasses
import sys

from tqdm import tqdm

import specdec
from specdec.checkpoint.fingerprint import fingerprint
from specdec.checkpoint.zoo import resolve_path
from specdec.lab import results, sweep, tables
from specdec.lab.sweep import SweepError


def run(cfg, out_dir: str, progress: bool = True) -> str:
  """Runs (or resumes) the sweep in out_dir; returns the draft-budget table as Markdown."""
  out = results.prepare_out_dir(out_dir)
  cfg = sweep.normalize(cfg)
  cells = sweep.expand(cfg)
  dtype = sweep.DTYPES.get(cfg.dtype)
  if dtype is None:
    raise SweepError(f"config.dtype: unknown {cfg.dtype!r}; choose from {list(sweep.DTYPES)}")
  target = specdec.load(
    resolve_path(cfg.target), dtype=dtype, fuse_projections=cfg.fuse_projections
  )
  if target.tokenizer is None:
    raise SweepError(f"config.target={cfg.target!r} has no tokenizer.json to encode prompts")
  sweep.check_methods(cfg)
  drafters = {
    m: sweep.load_drafter(m, cfg.checkpoints[m], target, dtype)
    for m in cfg.methods
    if m not in ("null", "ngram")
  }
  runner = sweep.Runner(cfg, target, drafters)
  longest = max(len(p) for p in runner.prompt_ids(0, 0))
  sweep.validate(cfg, cells, target.config.max_position_embeddings, longest, runner.check_memory)
  # The weights' identity too: the paths alone survive a retrain (a resume must not mix models).
  used = {"target": cfg.target, **{m: cfg.checkpoints[m] for m in drafters}}
  prints = {name: fingerprint(resolve_path(spec)) for name, spec in used.items()}
  results.write_config(out, {**cfg.to_dict(), "checkpoint_fingerprints": prints})

  path = out / results.RESULTS_NAME
  rows = results.load_rows(path) if path.exists() else []
  done = {sweep.cell_of(r): r for r in rows}
  units = [(leg, c) for leg in range(cfg.legs) for c in cells]
  todo = [(leg, c) for leg, c in units if (*dataclasses.astuple(c), leg) not in done]
  bar = tqdm(
    total=len(units), initial=len(units) - len(todo), disable=not progress, file=sys.stderr
  )
  for leg, cell in todo:
    bar.set_description(f"leg {leg} {cell.method} k={cell.k} ctx={cell.prompt_tokens}")
    base = done.get(sweep.baseline_key(cell, leg))
    row = runner.run(cell, leg, base["extra"]["output_sha"] if base else None)
    results.append_row(path, row)
    done[sweep.cell_of(row)] = row
    bar.update()
  bar.close()
  return tables.to_markdown(tables.build(results.load_rows(path), "draft_budget"))
