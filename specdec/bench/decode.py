"""Decode speed of large random targets, and what bounds it (issue 9).

Parts, each returning result rows (dicts) that carry their own conditions:
  copy       the device copy ceiling of this run: a jitted copy of a big bf16 array
  decode     one-token greedy decode steps (null drafter, k = 0) per (shape, format, B, context)
  verify     a width-w target forward over the cache against width 1
  attention  attention over the cache for w queries, per layer-call: XLA einsum (`attend_xla`),
             the Mosaic GPU kernel (kernels_pallas.decode_attention, what `attend` runs on a
             GPU), XLA's `dot_product_attention`, cuDNN's (with a mask bias, or with its padding
             mask only; see `attention_op`)
  loop       `timing.time_step` (k = 4 ngram), the empty loop's per-iteration slope and fixed cost,
             and the copies in its optimized HLO; one subprocess per XLA_FLAGS arm
  flags      one decode cell per arm (XLA_FLAGS, fused projections, attention path "auto" | "xla"),
             a subprocess per leg and arm, arms interleaved
  compile    lower + compile of the decode chunk in a fresh process, cold and then from the
             persistent compilation cache (a second fresh process)
  profile    the decode step's device kernels from a profiler trace (bench.gpu_profile): time
             per kernel and per HLO op, and the share of the step the device was busy

Targets are random (`specdec.bench.random_models`): speed does not depend on the values, and timings
start from a synthetic decode state, so no prefill runs.

"Context" is the cache's slot count S: the model's attention reads every slot and masks, so a step
reads all S slots of every row whatever the rows' lengths (they sit near the end of the cache).
Bytes read per step = every weight as stored (scales included; the embedding table counts only the
B rows gathered) + the K and V caches (2 L B S K H bytes x itemsize).
"""

import functools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from specdec.bench import gpu_profile, timing
from specdec.bench.random_models import (
  FORMATS,
  BenchConfigError,
  check_format,
  fill,
  model_config,
  random_model,
  random_params,
  step_bytes,
  synthetic_state,
)
from specdec.decoding.generate import cache_slots, prompt_bucket
from specdec.decoding.memory import tree_bytes
from specdec.decoding.step import StepConfig, decode_chunk
from specdec.drafters import ngram, null
from specdec.lab.results import append_row, environment_fields
from specdec.model import Model
from specdec.models.config import ModelConfig
from specdec.models.fuse import fuse_projections
from specdec.models.transformer import KVCache
from specdec.ops.attention import ATTENTION_PATHS, attend, attend_xla
from specdec.ops.sampling import Sampling
from specdec.xla_env import with_defaults

PARTS = ("copy", "decode", "verify", "attention", "loop", "flags", "compile", "profile")
ATTENTION_IMPLS = ("xla", "pallas", "xla_sdpa", "cudnn", "cudnn_seqlen")
DECODE_KV_DTYPES = ("model", "float8_e4m3fn")  # decode rows' caches: the weights' dtype, or FP8
COPY_CEILING_TBS = 4.24  # DESIGN.md section 9: torch device-to-device copy on the H200
# Issue 9's bars, as a fraction of COPY_CEILING_TBS, for B = 1 decode.
BARS = {"bf16": 0.85, "nvfp4": 0.70}
RESULT_TAG = "BENCH_DECODE_RESULT "


# --- timing helpers ----------------------------------------------------------------------------


def compile_aot(fn, *args, **static):
  """(compiled, seconds of lower + compile): the executable is called with the dynamic args only."""
  t = time.perf_counter()
  compiled = fn.lower(*args, **static).compile()
  return compiled, time.perf_counter() - t


def spread(per_s: list[float]) -> dict:
  """Median, min and max in microseconds, and the spread (max - min) / median."""
  med = statistics.median(per_s)
  return {
    "us": 1e6 * med,
    "us_min": 1e6 * min(per_s),
    "us_max": 1e6 * max(per_s),
    "spread": (max(per_s) - min(per_s)) / med,
    "reps": len(per_s),
  }


class Budget:
  """Wall seconds left for the run; 0 means no limit."""

  def __init__(self, seconds: float):
    self.seconds = seconds
    self.start = time.perf_counter()

  def left(self) -> float:
    return math.inf if not self.seconds else self.seconds - (time.perf_counter() - self.start)


# --- parts ------------------------------------------------------------------------------------


_copy = jax.jit(jnp.copy)  # not donated: XLA copies the array into a fresh output buffer


def copy_bandwidth(gib: float, n: int, reps: int) -> dict:
  """Device-to-device copy bandwidth, bytes read + written: per rep, n copies of a bf16 array
  enqueued back to back (dispatch overlaps the copies) and waited for once."""
  x = fill((int(gib * 2**29),), jnp.bfloat16, 0)
  y = jax.block_until_ready(_copy(x))  # compile and warm
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    for _ in range(n):
      y = _copy(x)  # the previous copy is freed once it is done
    jax.block_until_ready(y)
    times.append(time.perf_counter() - t)
  tbs = [2 * x.nbytes * n / t / 1e12 for t in times]
  return {"part": "copy", "gib": gib, "iters": n, "tb_s": statistics.median(tbs),
          "tb_s_min": min(tbs), "tb_s_max": max(tbs), "reps": reps}  # fmt: skip


def _null_step(config: ModelConfig, dtype) -> StepConfig:
  return StepConfig(config, dtype, null(), 0, Sampling(), "greedy", ())


def _decode_executable(model: Model, batch: int, slots: int, n_steps: int, reps: int):
  """(compiled chunk of n_steps one-token greedy steps, its warmed state, compile seconds); the
  state leaves room for `reps` more chunks."""
  sc = _null_step(model.config, model.dtype)
  start = slots - (reps + 1) * n_steps - 1
  st = synthetic_state(model.config, batch, slots, start, 0, model.kv_dtype or model.dtype)
  compiled, compile_s = compile_aot(decode_chunk, model.params, (), st, sc=sc, n_steps=n_steps)
  st = jax.block_until_ready(compiled(model.params, (), st))  # warm
  return compiled, st, compile_s


def decode_cell(model: Model, batch: int, slots: int, n_steps: int, reps: int) -> dict:
  """One-token greedy steps: `reps` chunks of n_steps, the state threaded (donated) through."""
  compiled, st, compile_s = _decode_executable(model, batch, slots, n_steps, reps)
  per_step = []
  for _ in range(reps):
    t = time.perf_counter()
    st = jax.block_until_ready(compiled(model.params, (), st))
    per_step.append((time.perf_counter() - t) / n_steps)
  nbytes = step_bytes(model.params, model.config, batch, slots, model.kv_dtype or model.dtype)
  med = statistics.median(per_step)
  total = nbytes["weight_bytes"] + nbytes["kv_bytes"]
  return {
    **spread(per_step),
    **nbytes,
    "tok_s": batch / med,
    "tb_s": total / med / 1e12,
    "n_steps": n_steps,
    "compile_s": compile_s,
  }


def profile_cell(
  model: Model, batch: int, slots: int, n_steps: int, reps: int, top: int, hlo_path: str
) -> dict:
  """The decode chunk's kernels over `reps` traced chunks (after a warm one), per step; the
  optimized HLO goes to `hlo_path` so each op stem can be looked up."""
  compiled, st, _ = _decode_executable(model, batch, slots, n_steps, reps)
  Path(hlo_path).write_text(compiled.as_text())
  state = [st]

  def call():
    state[0] = compiled(model.params, (), state[0])
    return state[0]

  t = time.perf_counter()
  kernels = gpu_profile.trace_kernels(call, reps)
  wall = time.perf_counter() - t
  return {
    **gpu_profile.summarize(kernels, reps * n_steps, top),
    "traced_step_us": 1e6 * wall / (reps * n_steps),  # tracing adds its own host overhead
    "n_steps": n_steps,
    "hlo_file": Path(hlo_path).name,
  }


def verify_cell(model: Model, slots: int, width: int, n: int, reps: int) -> dict:
  """A width-`width` target forward over the cache (B = 1), LM head included.

  timing.verify_loop does not donate the state, so each call also copies the cache into the loop's
  buffers once: measured on the H200 as ~1.2 ms per call for the 8B shape's 1k cache (the empty
  loop's fixed cost), i.e. ~20 us per iteration at n = 64, the same for every width.
  """
  sc = _null_step(model.config, model.dtype)
  st = synthetic_state(model.config, 1, slots, slots - width, 0, model.dtype)
  compiled, compile_s = compile_aot(timing.verify_loop, model.params, st, sc=sc, n=n, width=width)
  times = timing.timings(lambda: compiled(model.params, st), reps)
  return {**spread([t / n for t in times]), "iters": n, "compile_s": compile_s}


def attention_op(impl: str):
  """(q_BTNH, k_BSKH, v_BSKH, positions_BT) -> o_BTNH, query t seeing slots <= positions[:, t].

  xla: the einsum `attend_xla`. pallas: kernels_pallas.decode_attention (what `attend` runs on a
  GPU). xla_sdpa / cudnn: jax.nn.dot_product_attention with that visibility as a boolean mask
  (which JAX turns into an additive bias [B, 1, T, S]). cudnn_seqlen:
  cuDNN's padding mask (key_value_seq_lengths) and no bias: every query of a row sees the slots up
  to the row's LAST position, exact for T = 1 only (its causal masks are top-left aligned, not the
  bottom-right alignment a verify block needs), timed to show what the bias costs.
  """
  if impl == "xla":
    return attend_xla
  if impl == "pallas":
    from kernels_pallas.decode_attention import decode_attention

    return decode_attention

  def sdpa(q_BTNH, k_BSKH, v_BSKH, positions_BT):
    if impl == "cudnn_seqlen":
      return jax.nn.dot_product_attention(
        q_BTNH, k_BSKH, v_BSKH, key_value_seq_lengths=positions_BT[:, -1] + 1,
        implementation="cudnn",
      )  # fmt: skip
    visible_BTS = jnp.arange(k_BSKH.shape[1])[None, None, :] <= positions_BT[:, :, None]
    implementation = "cudnn" if impl == "cudnn" else "xla"
    return jax.nn.dot_product_attention(
      q_BTNH, k_BSKH, v_BSKH, mask=visible_BTS[:, None], implementation=implementation
    )

  return sdpa


@functools.partial(jax.jit, static_argnames=("impl", "n"))
def _attention_loop(q_BTNH, cache: KVCache, positions_BT, impl: str, n: int):
  op = attention_op(impl)

  def body(i, q_BTNH):
    # One call per layer on that layer's cache, as in the model, so K/V stream from HBM: looping
    # over one layer's cache would time the 50 MB L2. Each output is the next query, so nothing
    # is loop-invariant and nothing can be hoisted.
    for k_BSKH, v_BSKH in zip(cache.k, cache.v, strict=True):
      q_BTNH = op(q_BTNH, k_BSKH, v_BSKH, positions_BT)
    return q_BTNH

  return jax.lax.fori_loop(0, n, body, q_BTNH)


def attention_cell(
  config: ModelConfig, batch: int, slots: int, width: int, impl: str, n: int, reps: int
) -> dict:
  """Seconds per layer-call of attention for `width` queries per row over an S = slots cache,
  and its error against float32 `attend` on the same inputs."""
  cache = synthetic_state(config, batch, slots, slots - width + 1, 0, jnp.dtype(jnp.bfloat16)).cache
  shape_BTNH = (batch, width, config.num_heads, config.head_dim)
  q_BTNH = fill(shape_BTNH, jnp.bfloat16, 1, scale=1.0)
  positions_BT = jnp.broadcast_to(
    slots - width + jnp.arange(width, dtype=jnp.int32), (batch, width)
  )
  layer0 = (q_BTNH, cache.k[0], cache.v[0])
  o = jax.jit(attention_op(impl))(*layer0, positions_BT).astype(jnp.float32)
  ref = attend(*(a.astype(jnp.float32) for a in layer0), positions_BT)
  rel_err = float(jnp.linalg.norm(o - ref) / jnp.linalg.norm(ref))
  compiled, compile_s = compile_aot(_attention_loop, q_BTNH, cache, positions_BT, impl=impl, n=n)
  times = timing.timings(lambda: compiled(q_BTNH, cache, positions_BT), reps)
  per = [t / (n * config.num_layers) for t in times]
  kv_bytes = cache.k[0].nbytes + cache.v[0].nbytes
  return {
    **spread(per),
    "kv_bytes": kv_bytes,
    "tb_s": kv_bytes / statistics.median(per) / 1e12,
    "rel_err_vs_f32": rel_err,
    "layer_calls": n * config.num_layers,
    "compile_s": compile_s,
  }


_SHAPE_RE = re.compile(r"\b(pred|[usf]\d+|bf16|f8e4m3fn)\[([\d,]*)\]")
_ITEMSIZE = {"pred": 1, "bf16": 2, "f8e4m3fn": 1}


def _shape_bytes(shape_text: str) -> int:
  m = _SHAPE_RE.search(shape_text)
  if not m:
    return 0
  ty, dims = m.groups()
  size = _ITEMSIZE.get(ty) or int(ty[1:]) // 8
  return size * math.prod(int(d) for d in dims.split(",") if d)


def hlo_copies(hlo_text: str) -> dict:
  """Top-level copy / copy-start instructions of an optimized HLO module, split by whether they sit
  in a while body (paid every iteration) or elsewhere (paid once per call): count and bytes."""
  bodies = set(re.findall(r"\bbody=%?([\w.\-]+)", hlo_text))
  fused = set(re.findall(r"\bcalls=%?([\w.\-]+)", hlo_text))
  out = {"body": {"n": 0, "bytes": 0}, "elsewhere": {"n": 0, "bytes": 0}}
  comp = None
  for line in hlo_text.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if head:
      comp = head.group(1)
      continue
    m = re.match(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.+?) (copy|copy-start)\(", line)
    if m and comp not in fused:
      where = out["body" if comp in bodies else "elsewhere"]
      where["n"] += 1
      where["bytes"] += _shape_bytes(m.group(1))
  return out


def loop_overhead(
  shape: dict, k: int, prompt_tokens: int, n_steps: int, reps: int, slope_n, hlo_path: str
) -> dict:
  """timing.time_step (k, ngram, B = 1) and the empty loop: its per-iteration cost as the slope of
  the loop's time between two trip counts (dispatch and one-off copies cancel), its fixed cost per
  call, and the copies in its optimized HLO (written to `hlo_path`)."""
  config = model_config(shape)
  model = random_model(config)
  parts = timing.time_step(model, ngram(), timing.Shape(1, k, prompt_tokens, n_steps, reps))
  slots = cache_slots(prompt_bucket(prompt_tokens), n_steps * (k + 1) + 1, k)
  st = synthetic_state(config, 1, slots, prompt_tokens, k, model.dtype)
  lo, hi = slope_n
  per_iter, fixed = timing.per_iteration(functools.partial(timing.empty_loop, st), lo, hi, reps)
  hlo = timing.empty_loop.lower(st, lo).compile().as_text()
  Path(hlo_path).write_text(hlo)
  return {
    **{f"{key}_us": 1e6 * v for key, v in parts.items() if key != "draft_per_token_vs_target"},
    "empty_loop_slope_us": 1e6 * per_iter,
    "empty_loop_fixed_us": 1e6 * fixed,
    "empty_loop_trip_counts": [lo, hi],
    "state_bytes": tree_bytes(st),
    "hlo_copies": hlo_copies(hlo),
    "hlo_file": Path(hlo_path).name,
  }


def compile_time(shape: dict, fmt: str, batch: int, slots: int, n_steps: int, cache_dir: str):
  """Lower + compile of the decode chunk from abstract inputs, with the persistent cache on."""
  hits = []
  jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("cache_hits") else None
  )
  jax.config.update("jax_compilation_cache_dir", cache_dir)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  config = model_config(shape)
  dtype = jnp.dtype(jnp.bfloat16)
  params = jax.eval_shape(lambda: random_params(config, fmt, dtype))
  st = jax.eval_shape(lambda: synthetic_state(config, batch, slots, 1, 0, dtype))
  t0 = time.perf_counter()
  lowered = decode_chunk.lower(params, (), st, sc=_null_step(config, dtype), n_steps=n_steps)
  t1 = time.perf_counter()
  lowered.compile()
  t2 = time.perf_counter()
  return {"lower_s": t1 - t0, "compile_s": t2 - t1, "cache_hits": len(hits)}


def decode_child(
  shape: dict, fmt: str, batch: int, slots: int, n_steps: int, reps: int, fuse: bool
) -> dict:
  """decode_cell on a fresh random model (its projections fused if asked), for a process of its
  own (its own XLA_FLAGS)."""
  model = random_model(model_config(shape), fmt)
  return decode_cell(fuse_projections(model) if fuse else model, batch, slots, n_steps, reps)


_CHILDREN = {"loop": loop_overhead, "compile": compile_time, "flags": decode_child}


def flags_arm(arm) -> tuple[str, bool, str]:
  """(xla_flags, fuse, attention) of a flags arm; two-element arms keep the default "auto"."""
  return (*arm, "auto") if len(arm) == 2 else tuple(arm)


def run_child(
  kind: str, kwargs: dict, xla_flags: str | None = None, timeout=None, attention: str | None = None
) -> dict:
  """Runs _CHILDREN[kind](**kwargs) in a fresh Python process (its own XLA flags and caches);
  attention "xla" sets SPECDEC_ATTENTION=xla there, "auto" clears it (None: inherited)."""
  env = dict(os.environ)
  if xla_flags is not None:
    env["XLA_FLAGS"] = xla_flags
  if attention is not None:
    env["SPECDEC_ATTENTION"] = "xla" if attention == "xla" else ""
  spec = json.dumps({"kind": kind, "kwargs": kwargs})
  p = subprocess.run(
    [sys.executable, "-m", "specdec.bench.decode", spec],
    env=env,
    capture_output=True,
    text=True,
    timeout=None if timeout is None or math.isinf(timeout) else timeout,
  )
  lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT_TAG)]
  if p.returncode or not lines:
    raise RuntimeError(f"{kind} subprocess exited {p.returncode}: {p.stderr[-2000:]}")
  return json.loads(lines[-1][len(RESULT_TAG) :])


# --- the run ------------------------------------------------------------------------------------


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


class Runner:
  """Runs the parts in order, appending each row to results.jsonl as soon as it is measured."""

  def __init__(self, cfg, out_dir: str):
    self.cfg = cfg
    self.out = Path(out_dir)
    self.out.mkdir(parents=True, exist_ok=True)
    self.budget = Budget(cfg.budget_s)
    self.rows: list[dict] = []
    self.env = environment_fields()
    self.copy_tbs = None

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
      getattr(self, f"_{part}")(*([fmts] if part == "decode" else []))
    return self.rows

  def _copy(self):
    self.guarded({"part": "copy"}, self._copy_cell)

  def _copy_cell(self) -> dict:
    row = copy_bandwidth(self.cfg.copy_gib, self.cfg.copy_iters, self.cfg.reps)
    self.copy_tbs = row["tb_s"]
    return row

  def _shape_row(self, name: str, fmt: str) -> dict:
    config = model_config(self.cfg.shapes[name])
    return {
      "shape": name,
      "format": fmt,
      **dict(self.cfg.shapes[name]),
      "tie_word_embeddings": config.tie_word_embeddings,
      "fused": bool(self.cfg.fuse),
    }

  def _decode(self, fmts):
    c = self.cfg
    for fmt in fmts or c.formats:
      for name in c.shape_names:
        model = self._model(name, fmt)
        for kv in c.kv_dtypes:
          # An FP8 cache with unit scales: the speed of the path, not a calibration.
          m = model if kv == "model" or model is None else model.with_fp8_kv()
          for batch in c.batches:
            for ctx in c.contexts:
              cond = {
                "part": "decode",
                **self._shape_row(name, fmt),
                "kv_dtype": kv,
                "batch": batch,
                "context": ctx,
              }
              self.guarded(cond, self._decode_cell, m, batch, ctx)
          del m
        del model  # frees this shape's weights before the next one is built

  def _model(self, name: str, fmt: str) -> Model | None:
    """The random model (projections fused if cfg.fuse), or None once the budget is spent (its
    cells are then only recorded)."""
    if self.budget.left() <= 0:
      return None
    model = random_model(model_config(self.cfg.shapes[name]), fmt)
    return fuse_projections(model) if self.cfg.fuse else model

  def _decode_cell(self, model: Model, batch: int, ctx: int) -> dict:
    row = decode_cell(model, batch, ctx, self.cfg.n_steps, self.cfg.reps)
    row["pct_of_4_24"] = 100 * row["tb_s"] / COPY_CEILING_TBS
    if self.copy_tbs:
      row["pct_of_measured_copy"] = 100 * row["tb_s"] / self.copy_tbs
    return row

  def _verify(self):
    v = self.cfg.verify
    model = self._model(v.shape, v.format)
    for ctx in v.contexts:
      for width in v.widths:
        cond = {
          "part": "verify",
          **self._shape_row(v.shape, v.format),
          "batch": 1,
          "context": ctx,
          "width": width,
        }
        self.guarded(cond, verify_cell, model, ctx, width, v.iters, self.cfg.reps)
    del model

  def _attention(self):
    a = self.cfg.attention
    config = model_config(self.cfg.shapes[a.shape])
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
          self.guarded(
            cond, attention_cell, config, a.batch, ctx, width, impl, a.iters, self.cfg.reps
          )

  def _loop(self):
    lp = self.cfg.loop
    for i, flags in enumerate(lp.xla_flags):
      kwargs = dict(
        shape=dict(self.cfg.shapes[lp.shape]),
        k=lp.k,
        prompt_tokens=lp.prompt_tokens,
        n_steps=lp.n_steps,
        reps=self.cfg.reps,
        slope_n=list(lp.slope_n),
        hlo_path=str(self.out / f"empty_loop_arm{i}.hlo.txt"),
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
      self.guarded(cond, self._child, "loop", kwargs, flags)

  def _cell_kwargs(self, part) -> dict:
    """A child decode cell's arguments from a part's config (shape, format, batch, context)."""
    return dict(
      shape=dict(self.cfg.shapes[part.shape]),
      fmt=part.format,
      batch=part.batch,
      slots=part.context,
      n_steps=self.cfg.n_steps,
    )

  def _flags(self):
    """One decode cell per arm (XLA_FLAGS, projections fused or not, attention path), a process
    per (leg, arm), arms interleaved."""
    f = self.cfg.flags
    kwargs = dict(self._cell_kwargs(f), reps=self.cfg.reps)
    for leg in range(f.legs):
      for flags, fuse, attention in map(flags_arm, f.arms):
        cond = {
          "part": "flags",
          **self._shape_row(f.shape, f.format),
          "batch": f.batch,
          "context": f.context,
          "leg": leg,
          "xla_flags": with_defaults(flags),  # what the child runs with
          "attention": attention,
        }
        cond["fused"] = bool(fuse)  # the arm's, not cfg.fuse
        self.guarded(cond, self._flags_cell, {**kwargs, "fuse": bool(fuse)}, flags, attention)

  def _flags_cell(self, kwargs: dict, flags: str, attention: str) -> dict:
    row = self._child("flags", kwargs, flags, attention)
    row["pct_of_4_24"] = 100 * row["tb_s"] / COPY_CEILING_TBS
    return row

  def _compile(self):
    cp = self.cfg.compile
    kwargs = self._cell_kwargs(cp)
    with tempfile.TemporaryDirectory(prefix="jax-cache-") as cache_dir:
      for run in ("cold", "cached"):
        cond = {
          "part": "compile",
          **self._shape_row(cp.shape, cp.format),
          "batch": cp.batch,
          "context": cp.context,
          "n_steps": self.cfg.n_steps,
          "run": run,
        }
        self.guarded(cond, self._child, "compile", {**kwargs, "cache_dir": cache_dir}, None)

  def _profile(self):
    pf = self.cfg.profile
    for fmt in pf.formats:
      model = self._model(pf.shape, fmt)
      cond = {
        "part": "profile",
        **self._shape_row(pf.shape, fmt),
        "batch": pf.batch,
        "context": pf.context,
      }
      hlo = str(self.out / f"profile_{pf.shape}_{fmt}.hlo.txt")
      args = (model, pf.batch, pf.context, self.cfg.n_steps, self.cfg.reps, pf.top, hlo)
      self.guarded(cond, profile_cell, *args)
      del model

  def _child(self, kind: str, kwargs: dict, xla_flags: str | None, attention=None) -> dict:
    return run_child(kind, kwargs, xla_flags, timeout=self.budget.left(), attention=attention)


# --- Markdown -----------------------------------------------------------------------------------


def _fmt_us(r: dict) -> str:
  return f"{r['us']:.1f} ({r['us_min']:.1f}-{r['us_max']:.1f})"


def _status(r: dict) -> str | None:
  if "skipped" in r:
    return f"skipped: {r['skipped']}"
  if "error" in r:
    return f"error: {r['error'][:200]}"
  return None


def _section(title: str, columns: str, rule: str, rows, head, body) -> list[str]:
  """A Markdown table: head(r) names the row's conditions, body(r) its figures; a skipped or failed
  row shows its status in the figures' first cell and leaves the others empty."""
  out = ["", f"### {title}", "", columns, rule]
  n_cols = rule.count("|") - 1
  for r in rows:
    h = head(r)
    status = _status(r)
    out.append(f"{h} {status} " + "|" * (n_cols - h.count("|") + 1) if status else f"{h} {body(r)}")
  return out


def _decode_figures(r: dict) -> str:
  bar = BARS.get(r["format"]) if r["batch"] == 1 else None
  bar_txt = "" if bar is None else ("met" if r["pct_of_4_24"] >= 100 * bar else "NOT met")
  bar_txt += f" (>= {100 * bar:.0f}%)" if bar else ""
  gb = (
    f"{(r['weight_bytes'] + r['kv_bytes']) / 1e9:.2f} ({r['weight_bytes'] / 1e9:.2f} + "
    f"{r['kv_bytes'] / 1e9:.2f})"
  )
  measured = r.get("pct_of_measured_copy")
  return (
    f"{_fmt_us(r)} | {r['tok_s']:.1f} | {gb} | {r['tb_s']:.2f} | "
    f"{'' if measured is None else f'{measured:.1f}%'} | {r['pct_of_4_24']:.1f}% | {bar_txt} | "
    f"{r['compile_s']:.1f} |"
  )


LOOP_KEYS = (
  "step",
  "draft",
  "verify",
  "target_fwd",
  "accept_commit",
  "loop",
  "empty_loop_slope",
  "empty_loop_fixed",
)


def _loop_figures(r: dict) -> str:
  c = r["hlo_copies"]
  copies = (
    f"{c['body']['n']} ({c['body']['bytes'] / 1e6:.1f} MB) / "
    f"{c['elsewhere']['n']} ({c['elsewhere']['bytes'] / 1e6:.1f} MB)"
  )
  return "".join(f"{r[f'{k}_us']:.1f} | " for k in LOOP_KEYS) + f"{copies} |"


def _flags_label(r: dict) -> str:
  return f"`{r['xla_flags'] or '(default)'}`"


def markdown(rows: list[dict]) -> str:
  """The run's tables: every figure with its spread (min-max over reps) and conditions."""
  by = lambda part: [r for r in rows if r.get("part") == part]  # noqa: E731
  out = []
  for r in by("copy"):
    if _status(r):
      out.append(f"copy: {_status(r)}")
    else:
      out.append(
        f"Copy ceiling (bf16 {r['gib']} GiB jitted copy x{r['iters']}, read + write): "
        f"{r['tb_s']:.2f} TB/s ({r['tb_s_min']:.2f}-{r['tb_s_max']:.2f}, {r['reps']} reps)"
      )
  if by("decode"):
    out += _section(
      "Decode (one-token greedy step, null drafter, in-jit chunks)",
      "| shape | format | fused | KV | B | ctx | step us (min-max) | tok/s | GB read/step "
      "(weights + KV) | TB/s | % of measured copy | % of 4.24 | bar | compile s |",
      "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
      by("decode"),
      lambda r: (
        f"| {r['shape']} | {r['format']} | {'yes' if r.get('fused') else 'no'} | "
        f"{r.get('kv_dtype', 'model')} | {r.get('batch', '')} | {r.get('context', '')} |"
      ),
      _decode_figures,
    )
  if by("verify"):
    base = {r["context"]: r["us"] for r in by("verify") if r.get("width") == 1 and "us" in r}

    def verify_figures(r):
      ratio = f"{r['us'] / base[r['context']]:.3f}" if r["context"] in base else ""
      return f"{_fmt_us(r)} | {ratio} | {r['compile_s']:.1f} |"

    out += _section(
      "Verify width (target forward over the cache, B = 1, LM head included)",
      "| shape | ctx | width | fwd us (min-max) | x width 1 | compile s |",
      "|---|---:|---:|---:|---:|---:|",
      by("verify"),
      lambda r: f"| {r['shape']} | {r['context']} | {r['width']} |",
      verify_figures,
    )
  if by("attention"):
    out += _section(
      "Attention over the cache, one layer-call (bf16, w queries per row)",
      "| shape | B | ctx | width | impl | us (min-max) | KV TB/s | rel err vs f32 |",
      "|---|---:|---:|---:|---|---:|---:|---:|",
      by("attention"),
      lambda r: f"| {r['shape']} | {r['batch']} | {r['context']} | {r['width']} | {r['impl']} |",
      lambda r: f"{_fmt_us(r)} | {r['tb_s']:.2f} | {r['rel_err_vs_f32']:.1e} |",
    )
  if by("loop"):
    out += _section(
      "Step parts and loop overhead per XLA_FLAGS arm (timing.time_step, us)",
      "| XLA_FLAGS | step | draft | verify | target fwd | accept+commit | loop (time_step) "
      "| empty loop slope | empty loop fixed | HLO copies in while body / elsewhere |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
      by("loop"),
      lambda r: f"| {_flags_label(r)} |",
      _loop_figures,
    )
  if by("flags"):
    out += _section(
      "Decode step per arm (a process per leg and arm, arms interleaved)",
      "| XLA_FLAGS | fused q/k/v, gate/up | attention | shape | format | B | ctx | leg "
      "| step us (min-max) | tok/s | % of 4.24 |",
      "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|",
      by("flags"),
      lambda r: (
        f"| {_flags_label(r)} | {'yes' if r['fused'] else 'no'} | {r.get('attention', 'auto')} | "
        f"{r['shape']} | {r['format']} | {r['batch']} | {r['context']} | {r['leg']} |"
      ),
      lambda r: f"{_fmt_us(r)} | {r['tok_s']:.1f} | {r['pct_of_4_24']:.1f}% |",
    )
  if by("compile"):
    out += _section(
      "Compile of the decode chunk (fresh process each)",
      "| shape | format | B | ctx | n_steps | run | lower s | compile s | cache hits |",
      "|---|---|---:|---:|---:|---|---:|---:|---:|",
      by("compile"),
      lambda r: (
        f"| {r['shape']} | {r['format']} | {r['batch']} | {r['context']} | {r['n_steps']} "
        f"| {r['run']} |"
      ),
      lambda r: f"{r['lower_s']:.2f} | {r['compile_s']:.2f} | {r['cache_hits']} |",
    )
  for r in by("profile"):
    out += _profile_tables(r)
  return "\n".join(out)


def _profile_tables(r: dict) -> list[str]:
  fused = ", fused projections" if r.get("fused") else ""
  head = f"{r['shape']} {r['format']}{fused} B = {r['batch']} ctx {r['context']}"
  if _status(r):
    return ["", f"### Profile: {head}: {_status(r)}"]
  out = [
    "",
    f"### Profile: {head}",
    "",
    f"{r['kernels_per_step']:.0f} kernels and {r['kernel_us_per_step']:.1f} us of kernel time per "
    "step (summed: kernels that run side by side each count, so this can exceed the window); "
    f"traced window {r['window_us_per_step']:.1f} us per step, device busy "
    f"{100 * r['busy_fraction']:.1f}% of it; wall {r['traced_step_us']:.1f} us per step under the "
    f"tracer. HLO: {r['hlo_file']}.",
  ]
  for key, what in (("by_op", "HLO op stem"), ("by_kernel", "kernel")):
    out += [
      "",
      f"| {what} | per step | us per step | share of kernel time |",
      "|---|---:|---:|---:|",
    ]
    out += [
      f"| `{g['name'][:90]}` | {g['per_step']:.1f} | {g['us_per_step']:.1f} | "
      f"{100 * g['share']:.1f}% |"
      for g in r[key]
    ]
  return out


def _child_main(spec_json: str) -> None:
  spec = json.loads(spec_json)
  result = _CHILDREN[spec["kind"]](**spec["kwargs"])
  print(RESULT_TAG + json.dumps(result), flush=True)


if __name__ == "__main__":
  _child_main(sys.argv[1])
