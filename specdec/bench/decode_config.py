"""What a decode-benchmark config (configs/bench_decode.py) may hold, checked before anything
compiles: the part names, the formats, attention implementations and KV dtypes each part accepts,
the flags arms' form, and whether each context leaves room for the steps a cell times.
"""

import jax

from specdec.bench.attention_impls import ATTENTION_IMPLS
from specdec.bench.random_models import FORMATS, BenchConfigError, check_format, model_config
from specdec.ops.attention import ATTENTION_PATHS

PARTS = ("copy", "decode", "verify", "attention", "loop", "flags", "compile", "profile")
DECODE_KV_DTYPES = ("model", "float8_e4m3fn")  # decode rows' caches: the weights' dtype, or FP8


def flags_arm(arm) -> tuple[str, bool, str]:
  """(xla_flags, fuse, attention) of a flags arm; two-element arms keep the default "auto"."""
  return (*arm, "auto") if len(arm) == 2 else tuple(arm)


def _slots_needed(cfg) -> dict:
  return {
    "decode": (cfg.reps + 1) * cfg.n_steps + 2,
    "verify": max(cfg.verify.widths) + 1,
    "attention": max(cfg.attention.widths) + 1,
    "compile": cfg.n_steps + 2,
    "flags": (cfg.reps + 1) * cfg.n_steps + 2,
    "profile": (cfg.reps + 1) * cfg.n_steps + 2,
  }


def parse_parts(parts) -> list[tuple[str, tuple[str, ...] | None]]:
  """'decode' runs every configured format; 'decode.nvfp4' only that one (to order priorities)."""
  out = []
  for name in parts:
    part, _, fmt = name.partition(".")
    if part not in PARTS or (fmt and part != "decode"):
      raise BenchConfigError(f"unknown part {name!r}; choose from {PARTS} (or decode.<format>)")
    out.append((part, (fmt,) if fmt else None))
  return out


def validate(cfg) -> None:
  """Every problem a run would meet, raised before anything compiles."""
  parts = parse_parts(cfg.parts)
  for name in cfg.shape_names:
    if name not in cfg.shapes:
      raise BenchConfigError(f"shape_names: unknown shape {name!r}; known: {sorted(cfg.shapes)}")
  for sub in ("verify", "attention", "loop", "flags", "compile", "profile"):
    if cfg[sub].shape not in cfg.shapes:
      raise BenchConfigError(f"{sub}.shape: unknown shape {cfg[sub].shape!r}")
  formats = set(cfg.formats) | {fmt for _, fmts in parts for fmt in fmts or ()}
  formats |= {cfg.compile.format, cfg.flags.format, *cfg.profile.formats}
  for fmt in sorted(formats):
    if fmt not in FORMATS:
      raise BenchConfigError(f"unknown format {fmt!r}; choose from {FORMATS}")
  for name in cfg.shape_names:
    for fmt in sorted(formats):
      check_format(model_config(cfg.shapes[name]), fmt)
  if min(cfg.batches) < 1 or cfg.n_steps < 1 or cfg.reps < 1:
    raise BenchConfigError("batches, n_steps and reps must be >= 1")
  if min(cfg.verify.widths) < 1 or min(cfg.attention.widths) < 1:
    raise BenchConfigError("verify and attention widths must be >= 1")
  need = _slots_needed(cfg)
  ctxs = {
    "decode": cfg.contexts,
    "verify": cfg.verify.contexts,
    "attention": cfg.attention.contexts,
    "compile": (cfg.compile.context,),
    "flags": (cfg.flags.context,),
    "profile": (cfg.profile.context,),
  }
  for part, contexts in ctxs.items():
    if min(contexts) < need[part]:
      raise BenchConfigError(
        f"{part}: context {min(contexts)} is too small; it needs >= {need[part]} slots"
      )
  for impl in cfg.attention.impls:
    if impl not in ATTENTION_IMPLS:
      raise BenchConfigError(f"unknown attention impl {impl!r}; choose from {ATTENTION_IMPLS}")
  gpu_only = [i for i in cfg.attention.impls if i.startswith("cudnn") or i == "pallas"]
  if any(p == "attention" for p, _ in parts) and gpu_only:
    if jax.default_backend() != "gpu":
      raise BenchConfigError(
        f"attention impls {gpu_only} need a GPU; drop them from attention.impls"
      )
  for kv in cfg.kv_dtypes:
    if kv not in DECODE_KV_DTYPES:
      raise BenchConfigError(f"kv_dtypes: unknown {kv!r}; choose from {DECODE_KV_DTYPES}")
  for arm in cfg.flags.arms:
    if len(arm) not in (2, 3) or flags_arm(arm)[2] not in ATTENTION_PATHS:
      raise BenchConfigError(
        f"flags.arms entry {arm!r}: want (xla_flags, fuse) or (xla_flags, fuse, attention) with "
        f"attention in {ATTENTION_PATHS}"
      )
  arm_flags = [flags_arm(arm)[0] for arm in cfg.flags.arms]
  for sub, entries in (("loop.xla_flags", cfg.loop.xla_flags), ("flags.arms", arm_flags)):
    for flags in entries:
      if flags and not all(f.startswith("--") for f in flags.split()):
        raise BenchConfigError(f"{sub} entry {flags!r}: every flag must start with '--'")
  if cfg.flags.legs < 1:
    raise BenchConfigError(f"flags.legs must be >= 1, got {cfg.flags.legs}")
  if len(cfg.loop.slope_n) != 2 or not 0 < cfg.loop.slope_n[0] < cfg.loop.slope_n[1]:
    raise BenchConfigError(f"loop.slope_n must be two increasing trip counts: {cfg.loop.slope_n}")
