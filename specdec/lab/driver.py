"""Drives a sweep end to end: check everything, load once, compile ahead, run missing (cell, leg)s.

The config is checked twice: what needs no model (axes, methods, checkpoint paths) before anything
loads, the rest (prompt lengths, memory) after. Every executable the cells' timed batches need is
then built ahead of time on `compile_workers` threads (XLA compiles release the GIL), so the
cells themselves measure; the summary line gives the two times apart. A sweep whose executables
would take the process near the kernel's limit on memory mappings (`specdec.lab.mappings`: a CPU
sweep of ~200 executables) runs in waves: it compiles ahead while under 90% of the budget, runs
every leg of the leading cells that compiled, drops jax's executables, and goes on with the
rest (the legs stay interleaved within a wave). Between cells it also drops them when over the
budget (cells then compile what they need in their warm-up batch); the summary line says how
often it dropped them.
"""

import dataclasses
import os
import statistics
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, as_completed, wait
from pathlib import Path

import jax
from tqdm import tqdm

import specdec
from specdec import sharding
from specdec.checkpoint.fingerprint import fingerprint
from specdec.checkpoint.zoo import resolve_path
from specdec.decoding.compiles import CompileCounter
from specdec.decoding.generate import compile_lowered
from specdec.lab import mappings, results, sweep, tables
from specdec.lab.processes import Processes, check_same_config, owners
from specdec.lab.sweep import SweepError
from specdec.progress import BAR_FORMAT, clock, eta


def run(
  cfg, out_dir: str, progress: bool = True, compile_workers: int | None = None,
  processes: Processes | None = None,
) -> str:  # fmt: skip
  """Runs (or resumes) the sweep in out_dir; returns the draft-budget table as Markdown. A sweep
  refused before it wrote anything leaves no directory behind. compile_workers: threads of the
  ahead-of-time compile (None: one per CPU core; 0: none, each cell compiles what it runs).
  processes: this process's share of a sweep spread over several (`specdec.lab.processes`)."""
  fresh = not Path(out_dir).exists()
  workers = (os.cpu_count() or 1) if compile_workers is None else compile_workers
  out = results.prepare_out_dir(out_dir)
  try:
    return _run(cfg, out, progress, workers, processes or Processes())
  except BaseException:
    if fresh:
      _remove_if_empty(out)
    raise


def _remove_if_empty(out: Path) -> None:
  """Removes an empty out directory; another process of the sweep may have removed or filled it."""
  try:
    out.rmdir()
  except OSError:  # missing, or not empty
    pass


def check_process_count(cfg, count: int) -> None:
  """SweepError when `count` processes would leave one with nothing to run; call it before the
  processes join (a refused process 0 would take the coordinator down under the others)."""
  cells = check_before_loading(sweep.normalize(cfg))
  owners([(leg, c) for leg in range(cfg.legs) for c in cells], count)


def _other_targets(cfg) -> dict[str, str]:
  """{method: its per_method target} for the methods that run on a target not config.target."""
  return {m: t for m, t in sweep.method_targets(cfg).items() if t != cfg.target}


def check_before_loading(cfg) -> list:
  """Everything that needs no model: returns the cells."""
  sweep.check_methods(cfg)
  cells = sweep.expand(cfg)
  if cfg.dtype not in sweep.DTYPES:
    raise SweepError(f"config.dtype: unknown {cfg.dtype!r}; choose from {list(sweep.DTYPES)}")
  for name, spec in [
    ("target", cfg.target),
    *((f"per_method.{m}.target", t) for m, t in _other_targets(cfg).items()),
    *((f"checkpoints.{m}", cfg.checkpoints[m]) for m in cfg.methods if m not in sweep.MODEL_FREE),
  ]:
    path = resolve_path(spec)
    if not os.path.isdir(path):
      hint = ""
      if spec.startswith("zoo:"):  # a zoo model not built (or not shipped) yet
        hint = f" (build it: python -m experiments.build_zoo --models={spec[4:]}; docs/zoo.md)"
      raise SweepError(f"config.{name}={spec!r}: {path} is not a checkpoint directory{hint}")
  sweep.validate(cfg, cells)
  return cells


def _run(cfg, out: Path, progress: bool, workers: int, processes: Processes) -> str:
  cfg = sweep.normalize(cfg)
  cells = check_before_loading(cfg)
  units = [(leg, c) for leg in range(cfg.legs) for c in cells]
  mine = [
    u for u, o in zip(units, owners(units, processes.count), strict=True) if o == processes.index
  ]
  # The weights' identity too: the paths alone survive a retrain (a resume must not mix models).
  used = {"target": cfg.target}
  used |= {f"per_method.{m}.target": t for m, t in _other_targets(cfg).items()}
  used |= {m: cfg.checkpoints[m] for m in cfg.methods if m in cfg.checkpoints}
  prints = {name: fingerprint(resolve_path(spec)) for name, spec in used.items()}
  check_same_config(processes, {**cfg.to_dict(), "checkpoint_fingerprints": prints})
  dtype = sweep.DTYPES[cfg.dtype]
  mesh, devices = None, local_devices(cfg)
  if cfg.get("tensor_parallel", 1) > 1:
    try:
      mesh = sharding.make_mesh(tensor=cfg.tensor_parallel, devices=jax.local_devices())
    except sharding.ShardingError as e:
      raise SweepError(f"config.tensor_parallel={cfg.tensor_parallel}: {e}") from e
  runners = []
  for device in devices:  # each device holds its own copy of every model
    with jax.default_device(device):
      runners.append(load_runners(cfg, dtype, mesh))
  for target, runner in runners[0].items():
    if mesh is not None:  # each target format quantized and placed before anything compiles
      for fmt in cfg.target_formats:
        runner.target_for(fmt)
    max_positions = runner.target.config.max_position_embeddings
    on_target = [c for c in cells if c.target == target]
    sweep.validate(cfg, on_target, max_positions, runner.longest_prompt, runner.check_memory)
  results.write_config(out, {**cfg.to_dict(), "checkpoint_fingerprints": prints})

  path = out / results.RESULTS_NAME
  rows = results.load_rows(path) if path.exists() else []
  done = {sweep.cell_of(r): r for r in rows}
  todo = [(leg, c) for leg, c in mine if (*dataclasses.astuple(c), leg) not in done]
  # A device's share: groups of units with their baseline, round-robin, as processes share.
  share = owners(todo, len(devices), strict=False)
  parts = [[u for u, o in zip(todo, share, strict=True) if o == i] for i in range(len(devices))]
  budget = mappings.map_budget()
  ahead = {"built": 0, "hits": 0, "seconds": 0.0}

  def compile_ahead(device, r, cells) -> set:
    with jax.default_device(device):
      (b, h), s, covered = compile_cells(r, cells, workers, progress, budget)
    ahead["built"] += b
    ahead["hits"] += h
    ahead["seconds"] += s
    return covered

  if len(devices) > 1:
    for device, r, part in zip(devices, runners, parts, strict=True):
      compile_ahead(device, r, list(dict.fromkeys(c for _, c in part)))
  bar = tqdm(
    total=len(mine), initial=len(mine) - len(todo), disable=not progress, file=sys.stderr,
    unit="cells", bar_format=BAR_FORMAT,
  )  # fmt: skip
  measured, lock, released = [], threading.Lock(), [0]

  def run_part(device, r, part):
    with jax.default_device(device):
      for leg, cell in part:
        with lock:
          released[0] += mappings.release_if_over(budget)
        base = done.get(sweep.baseline_key(cell, leg))  # run earlier in this part
        with lock:  # the cell now running (the newest one started, on several devices)
          bar.set_description(
            f"leg {leg} {cell.workload} {cell.method} {cell.draft} ctx={cell.prompt_tokens} "
            f"T={cell.temperature}"
          )
        t0 = time.perf_counter()
        row = r.run(cell, leg, base["extra"]["output_sha"] if base else None)
        results.append_row(path, row)
        with lock:
          measured.append(time.perf_counter() - t0)
          done[sweep.cell_of(row)] = row
          mean, left = statistics.mean(measured), len(todo) - len(measured)
          bar.set_postfix_str(
            f"{eta(left, mean / len(devices))} at {mean:.2f} s/cell measured on "
            f"{len(devices)} device(s) (compiled ahead in {clock(ahead['seconds'])})"
          )
          bar.update()

  if len(devices) == 1:
    (device,), (r,), (part,) = devices, runners, parts
    while part:  # in waves (module docstring); one wave where everything compiles ahead
      left = list(dict.fromkeys(c for _, c in part))
      covered = compile_ahead(device, r, left)
      n = next((i for i, c in enumerate(left) if shape_of(r, c) not in covered), len(left))
      wave = set(left[: max(n, 1)])
      run_part(device, r, [u for u in part if u[1] in wave])
      part = [u for u in part if u[1] not in wave]
      if part:  # the wave's executables are done with: room for the next wave's
        mappings.release()
        released[0] += 1
  else:
    with ThreadPoolExecutor(max_workers=len(devices)) as pool:
      for f in [pool.submit(run_part, *a) for a in zip(devices, runners, parts, strict=True)]:
        f.result()
  bar.close()
  in_cells = sum(done[(*dataclasses.astuple(c), leg)]["compile_s"] or 0 for leg, c in todo)
  print(
    f"sweep: {len(todo)} (cell, leg)s; compiled ahead {ahead['built']} executables "
    f"({ahead['hits']} loaded from the persistent cache) in {ahead['seconds']:.1f} s on "
    f"{max(workers, 1)} threads; measured in "
    f"{sum(measured):.1f} s, of which {in_cells:.1f} s were compiles inside cells"
    + (
      f"; dropped jax's executables {released[0]} time(s) at {budget} memory mappings"
      if released[0] else ""
    ),
    file=sys.stderr,
  )  # fmt: skip
  return table(out)


def local_devices(cfg) -> list:
  """The local devices config.devices asks for (1: the default device)."""
  n = cfg.get("devices", 1)
  have = jax.local_devices()
  if not isinstance(n, int) or not 1 <= n <= len(have):
    raise SweepError(f"config.devices={n!r}: must be an int in [1, {len(have)}] on this host")
  if n > 1 and cfg.get("tensor_parallel", 1) > 1:
    raise SweepError("config.devices and config.tensor_parallel > 1 together: choose one")
  return have[:n] if n > 1 else [jax.local_devices()[0]]


def load_runners(cfg, dtype, mesh=None) -> sweep.Runners:
  """A Runner per target of the sweep, each with its models loaded (`load_models`)."""
  runners = sweep.Runners()
  for target in sweep.targets(cfg):
    sub = sweep.target_config(cfg, target)
    runners[target] = sweep.Runner(sub, *load_models(sub, dtype, mesh), mesh)
  return runners


def load_models(cfg, dtype, mesh=None) -> tuple:
  """(target, {method: drafter}) as the config asks, on the default device (or the mesh)."""
  if mesh is not None:
    try:
      target = specdec.load(resolve_path(cfg.target), dtype=dtype, mesh=mesh)
    except sharding.ShardingError as e:
      raise SweepError(f"config.tensor_parallel={cfg.tensor_parallel}: {e}") from e
  else:
    target = specdec.load(
      resolve_path(cfg.target), dtype=dtype, fuse_projections=cfg.fuse_projections
    )
  if target.tokenizer is None:
    raise SweepError(f"config.target={cfg.target!r} has no tokenizer.json to encode prompts")
  drafters = {
    m: sweep.load_drafter(m, cfg.checkpoints[m], target, dtype)
    for m in cfg.methods
    if m not in sweep.MODEL_FREE
  }
  return target, drafters


def table(out_dir) -> str:
  """The draft-budget table of every row in out_dir's results, as Markdown."""
  path = Path(out_dir) / results.RESULTS_NAME
  return tables.to_markdown(tables.build(results.load_rows(path), "draft_budget"))


def shape_of(runner, cell):
  """What a cell's executables depend on: cells whose prompts share a bucket, or that differ
  only in workload or seed, share them."""
  return dataclasses.replace(
    cell, workload="", prompt_tokens=runner.bucket(cell), sample_seed=0
  )  # fmt: skip


def compile_cells(
  runner, cells: list, workers: int, progress: bool = False, budget: int = 0
) -> tuple[tuple[int, int], float, set]:
  """((executables built, of which cache loads), wall seconds, shapes covered) of building the
  cells' shapes (`shape_of`) ahead of time, once each: lowered on this thread in the cells' order
  (see `generate.lower_ahead`: a rerun then finds every executable in the persistent cache), each
  new one compiled on one of `workers` threads as soon as it is lowered, so compiles overlap the
  lowering of later cells. workers = 0: nothing ahead, each cell compiles what it runs (every
  shape counts as covered). budget: memory mappings (0: no limit); with one, lowering waits while
  more than `workers` compiles are unfinished (their mappings not yet counted) and stops once the
  process holds 90% of the budget, leaving the shapes not covered to a later wave."""
  shapes = {}
  for c in cells:
    shapes.setdefault(shape_of(runner, c), c)
  if workers == 0:
    return (0, 0), 0.0, set(shapes)
  t0 = time.perf_counter()
  seen, futures, covered = {}, [], set()
  with ThreadPoolExecutor(max_workers=workers) as pool:
    with CompileCounter() as eager:  # quantizing a target format, small eager ops
      for shape, c in tqdm(
        shapes.items(), desc="lowering ahead", unit="cells", disable=not progress,
        file=sys.stderr, total=len(shapes),
      ):  # fmt: skip
        if budget:
          while len(queued := [f for f in futures if not f.done()]) > workers:
            wait(queued, return_when=FIRST_COMPLETED)
          if mappings.memory_maps() > budget * 9 // 10:
            break  # the rest wait for a later wave (module docstring)
        covered.add(shape)
        for lowered in runner.lower_ahead(c):
          # jax's own identity of an executable: calls with equal static arguments share one
          # lowering object. Equal HLO text is not enough: the null arm's prefill and a k = 1
          # drafter's have the same HLO and different static arguments, so jax keeps both.
          lowering = getattr(lowered, "_lowering", lowered)
          if id(lowering) not in seen:
            seen[id(lowering)] = lowering  # held, so no later object reuses its id
            futures.append(pool.submit(compile_lowered, lowered))
    built, hits = eager.count, eager.hits
    bar = tqdm(
      total=len(futures), desc="compiling ahead", unit="executables", disable=not progress,
      file=sys.stderr,
    )  # fmt: skip
    for done in as_completed(futures):
      c = done.result()
      built, hits = built + c.count, hits + c.hits
      bar.update()
    bar.close()
  return (built, hits), time.perf_counter() - t0, covered
