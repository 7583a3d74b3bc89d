"""Each `--config.parts` entry of the decode benchmark: the cells it runs, in order, and the
conditions each row carries. A part (BY_NAME) is a function of the `decode.Runner` (config, budget,
output directory) that hands every cell to `run.guarded`, which records its row, skip or error.

  copy       the device copy ceiling of this run: a jitted copy of a big bf16 array
  decode     one-token greedy decode steps (null drafter, k = 0) per (shape, format, KV dtype, B,
             context); `decode.<format>` runs that format only (to order priorities)
  verify     a width-w target forward over the cache against width 1
  attention  attention over the cache for w queries, per layer-call, per implementation
             (`attention_impls.attention_op`)
  loop       `timing.time_step` (k = 4 ngram), the empty loop's per-iteration slope and fixed cost,
             and the copies in its optimized HLO; one subprocess per XLA_FLAGS arm
  flags      one decode cell per arm (XLA_FLAGS, fused projections, attention path "auto" | "xla"),
             a subprocess per leg and arm, arms interleaved
  compile    lower + compile of the decode chunk in a fresh process, cold and then from the
             persistent compilation cache (a second fresh process)
  profile    the decode step's device kernels from a profiler trace (bench.gpu_profile): time
             per kernel and per HLO op, and the share of the step the device was busy

Decode, verify and profile models get q/k/v and gate/up fused if cfg.fuse; a flags arm sets it.
"""

import tempfile

from kernels_pallas.h200 import COPY_CEILING_TBS
from specdec.bench.attention_impls import attention_cell
from specdec.bench.decode_cells import copy_bandwidth, decode_cell, profile_cell, verify_cell
from specdec.bench.decode_child import run_child
from specdec.bench.decode_config import flags_arm
from specdec.bench.random_models import model_config, random_model
from specdec.model import Model
from specdec.models.fuse import fuse_projections
from specdec.xla_env import with_defaults


def _shape_row(cfg, name: str, fmt: str) -> dict:
  """A model's conditions: the shape's name and HF keys, the format, tied embeddings, fused."""
  config = model_config(cfg.shapes[name])
  return {
    "shape": name,
    "format": fmt,
    **dict(cfg.shapes[name]),
    "tie_word_embeddings": config.tie_word_embeddings,
    "fused": bool(cfg.fuse),
  }


def _model(run, name: str, fmt: str) -> Model | None:
  """The random model (projections fused if cfg.fuse), or None once the budget is spent (its
  cells are then only recorded)."""
  if run.budget.left() <= 0:
    return None
  model = random_model(model_config(run.cfg.shapes[name]), fmt)
  return fuse_projections(model) if run.cfg.fuse else model


def _child(run, kind: str, kwargs: dict, xla_flags: str | None, attention=None) -> dict:
  return run_child(kind, kwargs, xla_flags, timeout=run.budget.left(), attention=attention)


def _cell_kwargs(cfg, part) -> dict:
  """A child decode cell's arguments from a part's config (shape, format, batch, context)."""
  return dict(
    shape=dict(cfg.shapes[part.shape]),
    fmt=part.format,
    batch=part.batch,
    slots=part.context,
    n_steps=cfg.n_steps,
  )


def _copy(run) -> None:
  def cell() -> dict:
    row = copy_bandwidth(run.cfg.copy_gib, run.cfg.copy_iters, run.cfg.reps)
    run.copy_tbs = row["tb_s"]
    return row

  run.guarded({"part": "copy"}, cell)


def _decode(run, fmts=None) -> None:
  c = run.cfg

  def cell(model: Model, batch: int, ctx: int) -> dict:
    row = decode_cell(model, batch, ctx, c.n_steps, c.reps)
    row["pct_of_4_24"] = 100 * row["tb_s"] / COPY_CEILING_TBS
    if run.copy_tbs:
      row["pct_of_measured_copy"] = 100 * row["tb_s"] / run.copy_tbs
    return row

  for fmt in fmts or c.formats:
    for name in c.shape_names:
      model = _model(run, name, fmt)
      for kv in c.kv_dtypes:
        # An FP8 cache with unit scales: the speed of the path, not a calibration.
        m = model if kv == "model" or model is None else model.with_fp8_kv()
        for batch in c.batches:
          for ctx in c.contexts:
            cond = {
              "part": "decode",
              **_shape_row(c, name, fmt),
              "kv_dtype": kv,
              "batch": batch,
              "context": ctx,
            }
            run.guarded(cond, cell, m, batch, ctx)
        del m
      del model  # frees this shape's weights before the next one is built


def _verify(run) -> None:
  v = run.cfg.verify
  model = _model(run, v.shape, v.format)
  for ctx in v.contexts:
    for width in v.widths:
      cond = {
        "part": "verify",
        **_shape_row(run.cfg, v.shape, v.format),
        "batch": 1,
        "context": ctx,
        "width": width,
      }
      run.guarded(cond, verify_cell, model, ctx, width, v.iters, run.cfg.reps)
  del model


def _attention(run) -> None:
  a = run.cfg.attention
  config = model_config(run.cfg.shapes[a.shape])
  for ctx in a.contexts:
    for width in a.widths:
      for impl in a.impls:
        cond = {
          "part": "attention",
          "shape": a.shape,
          "batch": a.batch,
          "context": ctx,
          "width": width,
          "impl": impl,
        }
        run.guarded(cond, attention_cell, config, a.batch, ctx, width, impl, a.iters, run.cfg.reps)


def _loop(run) -> None:
  lp = run.cfg.loop
  for i, flags in enumerate(lp.xla_flags):
    kwargs = dict(
      shape=dict(run.cfg.shapes[lp.shape]),
      k=lp.k,
      prompt_tokens=lp.prompt_tokens,
      n_steps=lp.n_steps,
      reps=run.cfg.reps,
      slope_n=list(lp.slope_n),
      hlo_path=str(run.out / f"empty_loop_arm{i}.hlo.txt"),
    )
    cond = {
      "part": "loop",
      "shape": lp.shape,
      "k": lp.k,
      "drafter": "ngram",
      "batch": 1,
      "prompt_tokens": lp.prompt_tokens,
      "n_steps": lp.n_steps,
      "xla_flags": with_defaults(flags),  # what the child runs with
    }
    run.guarded(cond, _child, run, "loop", kwargs, flags)


def _flags(run) -> None:
  """One decode cell per arm (XLA_FLAGS, projections fused or not, attention path), a process
  per (leg, arm), arms interleaved."""
  f = run.cfg.flags
  kwargs = dict(_cell_kwargs(run.cfg, f), reps=run.cfg.reps)

  def cell(kwargs: dict, xla_flags: str, attention: str) -> dict:
    row = _child(run, "flags", kwargs, xla_flags, attention)
    row["pct_of_4_24"] = 100 * row["tb_s"] / COPY_CEILING_TBS
    return row

  for leg in range(f.legs):
    for xla_flags, fuse, attention in map(flags_arm, f.arms):
      cond = {
        "part": "flags",
        **_shape_row(run.cfg, f.shape, f.format),
        "batch": f.batch,
        "context": f.context,
        "leg": leg,
        "xla_flags": with_defaults(xla_flags),  # what the child runs with
        "attention": attention,
      }
      cond["fused"] = bool(fuse)  # the arm's, not cfg.fuse
      run.guarded(cond, cell, {**kwargs, "fuse": bool(fuse)}, xla_flags, attention)


def _compile(run) -> None:
  cp = run.cfg.compile
  kwargs = _cell_kwargs(run.cfg, cp)
  with tempfile.TemporaryDirectory(prefix="jax-cache-") as cache_dir:
    for which in ("cold", "cached"):
      cond = {
        "part": "compile",
        **_shape_row(run.cfg, cp.shape, cp.format),
        "batch": cp.batch,
        "context": cp.context,
        "n_steps": run.cfg.n_steps,
        "run": which,
      }
      run.guarded(cond, _child, run, "compile", {**kwargs, "cache_dir": cache_dir}, None)


def _profile(run) -> None:
  pf = run.cfg.profile
  for fmt in pf.formats:
    model = _model(run, pf.shape, fmt)
    cond = {
      "part": "profile",
      **_shape_row(run.cfg, pf.shape, fmt),
      "batch": pf.batch,
      "context": pf.context,
    }
    hlo = str(run.out / f"profile_{pf.shape}_{fmt}.hlo.txt")
    args = (model, pf.batch, pf.context, run.cfg.n_steps, run.cfg.reps, pf.top, hlo)
    run.guarded(cond, profile_cell, *args)
    del model


BY_NAME = {
  "copy": _copy,
  "decode": _decode,
  "verify": _verify,
  "attention": _attention,
  "loop": _loop,
  "flags": _flags,
  "compile": _compile,
  "profile": _profile,
}
