"""Peers on one machine: HF transformers against specdec on the same weights and prompts.

Two parts (issue 9, item 4):
* shape: plain greedy decoding at a real model's shape (default Qwen3-8B) with random weights,
  B = 1, a long random prompt per request: transformers with `cache_implementation="static"`
  (which it compiles on a GPU) against `specdec.generate` with no drafter.
* zoo: speculative decoding on the tiny zoo pair and HumanEval prompts at one k: HF assisted
  generation (the zoo draft LM as `assistant_model`) and HF prompt lookup against specdec's
  draft_lm and ngram drafters, each beside its framework's plain greedy decode.

Measurement (docs/design.md, "Measurement conventions"): the arms of a part run interleaved (every
arm's leg 0, then every arm's leg 1, ...); request 0 of each leg is the warm-up and is left out of
every timing; rows carry both rate conventions (specdec.metrics), tables the spread between legs.
The greedy gate runs in the same run: specdec's speculative outputs must be token-identical to its
same-shape baseline (see ZOO_ARMS), HF's to HF's plain greedy decode. How far each arm agrees with
specdec's plain greedy tokens is reported, not gated: two frameworks round bf16 differently, and
random weights put argmax near-ties everywhere.

transformers runs in a worker process (`peers_torch.py`, see its docstring for why and for
how both sides get the same random weights without moving them). The worker's host clock times its
requests; only differences of one clock enter a figure.
"""

import dataclasses
import functools
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

import specdec
from specdec import metrics
from specdec.bench import peers_torch
from specdec.checkpoint import names
from specdec.checkpoint.loader import expected_shapes
from specdec.checkpoint.zoo import resolve_path
from specdec.data import workload as workload_lib
from specdec.decoding.generate import check_cache_room, generate, prompt_bucket
from specdec.drafters import draft_lm, ngram, null
from specdec.lab import results
from specdec.lab.sweep import DTYPES
from specdec.models.config import ConfigError, from_hf_dict, to_hf_dict
from specdec.models.fuse import fuse_projections

PARTS = ("shape", "zoo")
WORKER = Path(peers_torch.__file__)
# JAX would take 75% of the GPU at its first use; the worker needs room beside it.
JAX_MEM_FRACTION = "0.4"


class PeerError(ValueError):
  """A peer-benchmark config that cannot run, or a worker that failed."""


@dataclasses.dataclass(frozen=True)
class Arm:
  method: str  # the row's method: null / same_shape / ngram / draft_lm (specdec), hf_* (HF)
  baseline: str = ""  # the same framework's greedy arm whose tokens gate this one ("": is one)
  uses_k: bool = False  # verifies k drafts per target forward (else k = 0)
  acceptance: str = "greedy"

  @property
  def framework(self) -> str:
    return "transformers" if self.method.startswith("hf_") else "specdec"


SHAPE_ARMS = (Arm("null"), Arm("hf_static"))
# specdec's drafters are gated against the same-shape baseline (docs/design.md, "The step": at
# verify width k+1, every draft rejected): in bf16 a width-(k+1) verify rounds differently from a
# width-1 decode step and flips argmax near-ties, so identity with plain greedy decoding (the
# "identical to specdec greedy" column) is reported beside the gate rather than being it.
ZOO_ARMS = (
  Arm("null"),
  Arm("hf_greedy"),
  Arm("same_shape", uses_k=True, acceptance="reject"),
  Arm("draft_lm", "same_shape", uses_k=True),
  Arm("hf_assisted", "hf_greedy", uses_k=True),
  Arm("ngram", "same_shape", uses_k=True),
  Arm("hf_prompt_lookup", "hf_greedy", uses_k=True),
)
# (specdec arm, transformers arm) compared per part; the first pair of each part carries its bar.
SHAPE_PAIRS = (("null", "hf_static"),)
ZOO_PAIRS = (("draft_lm", "hf_assisted"), ("ngram", "hf_prompt_lookup"), ("null", "hf_greedy"))


def schedule(arms, legs: int) -> list[tuple[int, Arm]]:
  """(leg, arm) in run order: all arms' leg 0, then all arms' leg 1 (A, B, A, B)."""
  return [(leg, arm) for leg in range(legs) for arm in arms]


# --- config -------------------------------------------------------------------------------------


def normalize(cfg):
  """`--config.parts=shape,zoo` arrives as one string; the rest of the code wants a tuple."""
  cfg = cfg.copy_and_resolve_references()
  with cfg.unlocked():
    items = (cfg.parts,) if isinstance(cfg.parts, str) else cfg.parts
    cfg.parts = tuple(p.strip() for item in items for p in item.split(",") if p.strip())
  return cfg


def shape_config(cfg):
  """The ModelConfig of the shape part (no EOS: every request decodes its full budget)."""
  try:
    return from_hf_dict({"model_type": "qwen3", **cfg.shape.model.to_dict()}, "config.shape.model")
  except ConfigError as e:
    raise PeerError(str(e)) from e


def validate(cfg) -> None:
  """Every problem a run would hit late (after minutes of loading), raised before any work."""
  if not cfg.parts or any(p not in PARTS for p in cfg.parts):
    raise PeerError(f"config.parts={cfg.parts!r}: choose one or more of {', '.join(PARTS)}")
  if cfg.legs < 2:
    raise PeerError(f"config.legs={cfg.legs}: arms need >= 2 interleaved legs")
  if cfg.dtype not in DTYPES:
    raise PeerError(f"config.dtype={cfg.dtype!r}: choose from {', '.join(DTYPES)}")
  if cfg.torch_device not in ("auto", "cuda", "cpu"):
    raise PeerError(f"config.torch_device={cfg.torch_device!r}: choose auto, cuda or cpu")
  if cfg.torch_python and shutil.which(cfg.torch_python) is None:
    raise PeerError(f"config.torch_python={cfg.torch_python!r} is not an executable")
  if "shape" in cfg.parts:
    s = cfg.shape
    if s.n_requests < 2:
      raise PeerError(f"config.shape.n_requests={s.n_requests}: request 0 is warm-up, need >= 2")
    if s.max_new_tokens < 2 or s.prompt_tokens < 1:
      raise PeerError("config.shape: need max_new_tokens >= 2 (tpot) and prompt_tokens >= 1")
    config = shape_config(cfg)
    try:
      check_cache_room(s.prompt_tokens, s.max_new_tokens, 0, config.max_position_embeddings)
    except ValueError as e:
      raise PeerError(f"config.shape: {e}") from e
  if "zoo" in cfg.parts:
    z = cfg.zoo
    if z.n_prompts < 2:
      raise PeerError(f"config.zoo.n_prompts={z.n_prompts}: request 0 is warm-up, need >= 2")
    if z.k < 1 or z.max_new_tokens < 2:
      raise PeerError(f"config.zoo: need k >= 1 (got {z.k}) and max_new_tokens >= 2")
    if not 1 <= z.ngram.min_n <= z.ngram.max_n:
      raise PeerError(f"config.zoo.ngram: need 1 <= min_n <= max_n, got {z.ngram.to_dict()}")
    for key in ("target", "draft"):
      if not os.path.isdir(resolve_path(z[key])):
        raise PeerError(f"config.zoo.{key}={z[key]!r} is not a checkpoint directory")


# --- the same random weights on both sides ------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("shape", "exp", "dtype", "transpose"))
def _hashed(key, shape, exp, dtype, transpose):
  idx = jnp.arange(math.prod(shape), dtype=jnp.uint32)
  b = peers_torch.hashed_bytes(idx, key, lambda v: v)
  a = ((b.astype(jnp.float32) - 128.0) * 2.0**-exp).astype(dtype).reshape(shape)
  return a.T if transpose else a


def hashed_params(config, dtype, seed: int, exp: int) -> dict:
  """Our params holding the weights the worker's `build_random` gives the HF model."""
  flat = {}
  for path, shape in expected_shapes(config).items():
    if len(shape) == 1:
      flat[path] = jnp.ones(shape, dtype)
      continue
    name, transpose = names.to_hf_name(path)
    hf_shape = tuple(shape[::-1]) if transpose else tuple(shape)
    key = jnp.uint32(peers_torch.tensor_seed(name, seed))
    flat[path] = _hashed(key, hf_shape, exp, jnp.dtype(dtype), transpose)
  return {"params": unflatten_dict({tuple(p.split("/")): v for p, v in flat.items()})}


@functools.partial(jax.jit, static_argnames=("exp",))
def _checksum(a, exp):
  return jnp.sum((a.astype(jnp.float32) * 2.0**exp).astype(jnp.int32))  # int32 adds wrap


def fingerprints(params, exp: int) -> dict[str, int]:
  """HF tensor name -> sum(value * 2**exp) mod 2**32, the worker's `_fingerprint`."""
  out = {}
  for key, v in flatten_dict(params["params"]).items():
    name, _ = names.to_hf_name("/".join(key))
    out[name] = int(_checksum(v, exp)) % 2**32
  return out


def check_same_weights(ours: dict[str, int], theirs: dict[str, int]) -> None:
  if ours != theirs:
    bad = sorted(n for n in ours.keys() | theirs.keys() if ours.get(n) != theirs.get(n))
    raise PeerError(
      f"the two sides built different weights: {len(bad)} tensors differ, e.g. {bad[:3]} "
      f"(ours {[ours.get(n) for n in bad[:3]]}, theirs {[theirs.get(n) for n in bad[:3]]})"
    )


# --- the transformers worker --------------------------------------------------------------------


class TorchPeer:
  """specdec/bench/peers_torch.py in its own process, called op by op (see its docstring)."""

  def __init__(self, python: str, device: str):
    self.python = shutil.which(python) if python else sys.executable
    if self.python is None:
      raise PeerError(f"config.torch_python={python!r} is not an executable")
    # stderr is inherited: transformers' warnings and a crash's traceback show up in our log.
    self.proc = subprocess.Popen(
      [self.python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
      self.info = self.call("hello", device=device)
    except PeerError as e:
      self.close()
      raise PeerError(
        f"{e}\n(config.torch_python must name a Python with torch and transformers)"
      ) from e

  def call(self, op: str, **kw):
    try:
      self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
      self.proc.stdin.flush()
    except BrokenPipeError:
      pass  # the worker is gone; readline says so below
    line = self.proc.stdout.readline()
    if not line:
      raise PeerError(
        f"the transformers worker ({self.python} {WORKER.name}) exited with code "
        f"{self.proc.wait()} during {op!r}; its stderr is above"
      )
    reply = json.loads(line)
    if "error" in reply:
      raise PeerError(
        f"the transformers worker ({self.python}) failed in {op!r}:\n{reply['error'].rstrip()}"
      )
    return reply["ok"]

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.stdin.close()
      try:
        self.proc.wait(timeout=60)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


# --- one leg of one arm -------------------------------------------------------------------------


@dataclasses.dataclass
class LegResult:
  requests: list  # metrics.Request per prompt, in issue order (request 0 = warm-up)
  tokens: list  # generated ids per prompt
  forwards: list  # target forwards per request, the prefill included; None where not counted
  counts: dict | None = None  # specdec's acceptance counts (metrics.COUNTS), summed over requests
  compiled: bool | None = None  # transformers compiled its forward (its static-cache path)


def specdec_leg(
  model, drafter, k: int, prompts, max_new: int, min_bucket: int, acceptance: str = "greedy"
) -> LegResult:
  """One `generate` per prompt (B = 1), timed the way the sweep times a request."""
  res = LegResult([], [], [])
  counts = []
  for ids in prompts:
    g = generate(
      model, [ids], max_new_tokens=max_new, drafter=drafter, k=k, acceptance=acceptance,
      min_bucket=min_bucket,
    )  # fmt: skip
    s = g.stats
    start = s["start_s"]
    res.requests.append(
      metrics.Request(start, start + s["prefill_s"], start + s["finish_s"][0], s["tokens_out"][0])
    )
    res.tokens.append(g.tokens[0])
    res.forwards.append(s["rows"]["steps"][0] + 1)
    counts.append({name: np.asarray(s[name]) for name in metrics.COUNTS})
  res.counts = {name: np.sum([c[name] for c in counts], axis=0) for name in metrics.COUNTS}
  return res


def hf_leg(peer: TorchPeer, arm: Arm, prompts, max_new: int, model: str, **kw) -> LegResult:
  out = peer.call(
    "generate", arm=arm.method.removeprefix("hf_"), prompts=prompts, max_new_tokens=max_new,
    target=model, **kw,
  )  # fmt: skip
  reqs = out["requests"]
  return LegResult(
    requests=[
      metrics.Request(r["start_s"], r["first_token_s"], r["end_s"], len(r["tokens"])) for r in reqs
    ],
    tokens=[r["tokens"] for r in reqs],
    forwards=[r["target_forwards"] for r in reqs],
    compiled=out["compiled"],
  )


def agreement(ref: list[list[int]], other: list[list[int]]) -> dict:
  """How far `other` follows `ref`, prompt by prompt: tokens before the first difference.

  After a first difference the two continue from different contexts, so later positions say
  nothing; the share counts the common prefix of each prompt over all of `ref`'s tokens.
  """
  common = 0
  for a, b in zip(ref, other, strict=True):
    n = min(len(a), len(b))
    diff = next((i for i in range(n) if a[i] != b[i]), n)
    common += diff
  total = sum(len(a) for a in ref)
  return {
    "agree_share": common / total if total else math.nan,
    "identical": sum(a == b for a, b in zip(ref, other, strict=True)),
    "n": len(ref),
  }


def leg_row(arm: Arm, leg: int, res: LegResult, cond: dict, outputs: dict) -> dict:
  """One result row (lab.results schema); `outputs[(leg, method)]` holds earlier arms' tokens.

  Gate: a baseline arm is its framework's reference; a drafted arm must reproduce its baseline's
  tokens exactly. Agreement with specdec's greedy tokens (the `null` arm) goes under `extra`.
  """
  if arm.baseline:
    passed = res.tokens == outputs[(leg, arm.baseline)]
    gate = f"greedy outputs == {arm.baseline} ({arm.framework}), same leg"
  else:
    passed, gate = True, f"baseline ({arm.framework})"
  ids = cond["prompts"]
  agree = agreement(outputs[(leg, "null")], res.tokens)
  counted = [(len(t), f) for t, f in zip(res.tokens, res.forwards, strict=True) if f is not None]
  row = {
    "method": arm.method,
    "k": cond["k"] if arm.uses_k else 0,
    "workload": cond["workload"],
    "prompt_tokens": cond["prompt_tokens"],
    "ctx_bucket": metrics.bucket_labels()[int(metrics.ctx_bucket(len(ids[0])))],
    "temperature": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "acceptance": arm.acceptance,
    "target_format": "bf16",  # the sweep's name for a target as loaded (not quantized)
    "kv_dtype": "model",
    "batch": 1,
    "seed": cond["seed"],
    "leg": leg,
    "target": cond["target"],
    "drafter": cond["drafters"].get(arm.method, arm.method),
    "max_new_tokens": cond["max_new_tokens"],
    "n_prompts": len(ids),
    **results.environment_fields(),
    **metrics.timing_summary(res.requests, discard_first=1),  # B = 1: request 0 compiles
    "gate_passed": bool(passed),
    "gate": gate,
    "extra": {
      "framework": arm.framework,
      "part": cond["part"],
      "dtype": cond["dtype"],
      # Tokens per target forward with the prefill counted as one (HF's first assisted forward
      # is prefill and verify at once, so only this form compares across frameworks).
      "tokens_per_forward": (
        sum(n for n, _ in counted) / sum(f for _, f in counted) if counted else math.nan
      ),
      **{f"{key}_vs_specdec_greedy": v for key, v in agree.items()},
      "prompt_lengths": [len(p) for p in ids],
      "peer": cond["peer"],
      **({"compiled": res.compiled} if res.compiled is not None else {}),
      **cond.get("extra", {}),
    },
  }
  if res.counts is not None:
    row.update(metrics.acceptance_summary(*(res.counts[name] for name in metrics.COUNTS)))
    row.update({name: res.counts[name].tolist() for name in metrics.COUNTS})
    row["ctx_edges"] = [None if math.isinf(e) else e for e in metrics.DEFAULT_CTX_EDGES]
  return row


def run_legs(arms, legs: int, prompts_of, run_arm, cond: dict, sink) -> list[dict]:
  """Every (leg, arm) in `schedule` order; `sink(row)` stores each row as it is made."""
  outputs, rows = {}, []
  for leg, arm in schedule(arms, legs):
    prompts = prompts_of(leg)
    res = run_arm(arm, prompts)
    outputs[(leg, arm.method)] = res.tokens
    row = leg_row(arm, leg, res, {**cond, "prompts": prompts}, outputs)
    sink(row)
    rows.append(row)
  return rows


# --- the two parts ------------------------------------------------------------------------------


def run_shape(cfg, peer: TorchPeer, sink) -> list[dict]:
  s, dtype = cfg.shape, DTYPES[cfg.dtype]
  config = shape_config(cfg)
  theirs = peer.call(
    "build_random", name="shape", config=to_hf_dict(config), seed=cfg.seed, exp=s.weight_exp,
    dtype=cfg.dtype,
  )  # fmt: skip
  model = specdec.Model(config, hashed_params(config, dtype, cfg.seed, s.weight_exp), dtype=dtype)
  check_same_weights(fingerprints(model.params, s.weight_exp), theirs)
  model = fuse_projections(model, release=True)  # as specdec.load decodes a checkpoint
  V = config.vocab_size

  def prompts_of(leg):  # fresh random prompts per leg and request
    rng = np.random.default_rng([cfg.seed, leg])
    return rng.integers(0, V, (s.n_requests, s.prompt_tokens)).tolist()

  def run_arm(arm, prompts):
    if arm.framework == "transformers":
      return hf_leg(peer, arm, prompts, s.max_new_tokens, "shape")
    return specdec_leg(model, null(), 0, prompts, s.max_new_tokens, prompt_bucket(s.prompt_tokens))

  cond = {
    "part": "shape", "k": 0, "workload": f"random_{s.prompt_tokens}", "dtype": cfg.dtype,
    "prompt_tokens": s.prompt_tokens, "seed": cfg.seed, "max_new_tokens": s.max_new_tokens,
    "target": "random:" + ",".join(f"{k}={v}" for k, v in s.model.items()), "drafters": {},
    "peer": peer.info, "extra": {"weights": f"hashed, seed {cfg.seed}, 2**-{s.weight_exp} steps"},
  }  # fmt: skip
  return run_legs(SHAPE_ARMS, cfg.legs, prompts_of, run_arm, cond, sink)


def run_zoo(cfg, peer: TorchPeer, sink) -> list[dict]:
  z, dtype = cfg.zoo, DTYPES[cfg.dtype]
  target = specdec.load(resolve_path(z.target), dtype=dtype)
  draft = specdec.load(resolve_path(z.draft), dtype=dtype)
  peer.call("load", name="zoo_target", path=resolve_path(z.target), dtype=cfg.dtype)
  peer.call("load", name="zoo_draft", path=resolve_path(z.draft), dtype=cfg.dtype)
  texts = workload_lib.select(workload_lib.load_humaneval(rstrip=True), z.n_prompts)
  V, eos = target.config.vocab_size, target.config.eos_token_ids

  @functools.cache
  def prompts_of(leg):  # the sweep's rule: leg l substitutes one token by repetition l
    return [
      workload_lib.prompt_ids(p.text, target.encode, repetition=leg, vocab_size=V, avoid=eos)
      for p in texts
    ]

  bucket = prompt_bucket(max(len(p) for p in prompts_of(0)))  # one bucket: one compile per arm
  drafters = {
    "null": null(),
    "same_shape": null(),
    "draft_lm": draft_lm(draft),
    "ngram": ngram(z.ngram.min_n, z.ngram.max_n),
  }
  hf_kw = {
    "hf_greedy": {},
    "hf_assisted": {"draft": "zoo_draft", "k": z.k},
    "hf_prompt_lookup": {"k": z.k, "max_ngram": z.ngram.max_n},
  }

  def run_arm(arm, prompts):
    if arm.framework == "transformers":
      return hf_leg(peer, arm, prompts, z.max_new_tokens, "zoo_target", **hf_kw[arm.method])
    k = z.k if arm.uses_k else 0
    return specdec_leg(
      target, drafters[arm.method], k, prompts, z.max_new_tokens, bucket, arm.acceptance
    )

  cond = {
    "part": "zoo", "k": z.k, "workload": "humaneval", "dtype": cfg.dtype, "prompt_tokens": 0,
    "seed": cfg.seed, "max_new_tokens": z.max_new_tokens, "target": z.target,
    "drafters": {"draft_lm": z.draft, "hf_assisted": z.draft, "same_shape": "null",
                 "ngram": f"ngram {z.ngram.min_n}-{z.ngram.max_n}",
                 "hf_prompt_lookup": f"prompt lookup, max ngram {z.ngram.max_n}"},
    "peer": peer.info,
  }  # fmt: skip
  return run_legs(ZOO_ARMS, cfg.legs, prompts_of, run_arm, cond, sink)


# --- tables -------------------------------------------------------------------------------------


def _rate(values) -> str:
  s = metrics.leg_spread(values)
  return f"{s['mean']:.1f} ±{100 * s['rel_half_range']:.1f}%"


def _num(x: float) -> str:
  return "—" if math.isnan(x) else f"{x:.2f}"


def _by_method(rows) -> dict[str, list[dict]]:
  out: dict[str, list[dict]] = {}
  for r in sorted(rows, key=lambda r: r["leg"]):
    out.setdefault(r["method"], []).append(r)
  return out


def pair_ratio(rows, ours: str, theirs: str, key: str = "decode_tok_s") -> dict:
  """Our rate over theirs: of the leg means, and per leg (legs are paired: same prompts)."""
  by = _by_method(rows)
  a, b = [r[key] for r in by[ours]], [r[key] for r in by[theirs]]
  per_leg = [metrics.speedup(x, y) for x, y in zip(a, b, strict=True)]
  ratio = metrics.speedup(float(np.nanmean(a)), float(np.nanmean(b)))
  return {"ratio": ratio, "min": float(np.nanmin(per_leg)), "max": float(np.nanmax(per_leg))}


def part_table(rows, pairs, bar: float) -> str:
  """Markdown: one line per arm (legs merged), then the ratios; the first pair carries `bar`."""
  lines = [
    "| arm | framework | k | decode tok/s | whole tok/s | TTFT ms (median) | tau "
    "| tokens / target fwd | gate | identical to specdec greedy |",
    "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
  ]
  by = _by_method(rows)
  for method, rs in by.items():
    x = rs[0]["extra"]
    tau = _num(np.mean([r["tau"] for r in rs])) if "tau" in rs[0] else "—"
    ident = sum(r["extra"]["identical_vs_specdec_greedy"] for r in rs)
    n = sum(r["extra"]["n_vs_specdec_greedy"] for r in rs)
    share = np.mean([r["extra"]["agree_share_vs_specdec_greedy"] for r in rs])
    gate = "passed" if all(r["gate_passed"] for r in rs) else "FAILED"
    lines.append(
      f"| {method} | {x['framework']} | {rs[0]['k']} | {_rate([r['decode_tok_s'] for r in rs])} "
      f"| {_rate([r['whole_tok_s'] for r in rs])} "
      f"| {np.mean([r['ttft_ms_median'] for r in rs]):.1f} | {tau} "
      f"| {_num(np.mean([r['extra']['tokens_per_forward'] for r in rs]))} | {gate} "
      f"| {ident}/{n} prompts, {100 * share:.1f}% of tokens |"
    )
  lines.append("")
  for i, (ours, theirs) in enumerate(pairs):
    d, w = pair_ratio(rows, ours, theirs), pair_ratio(rows, ours, theirs, "whole_tok_s")
    text = (
      f"* {ours} / {theirs}: **{d['ratio']:.2f}x** decode-only "
      f"(legs {d['min']:.2f}-{d['max']:.2f}), {w['ratio']:.2f}x whole-run"
    )
    if i == 0:
      admissible = all(r["gate_passed"] for r in by[ours])
      held = admissible and d["ratio"] >= bar
      text += f"; bar >= {bar}x decode-only: {'held' if held else 'NOT held'}"
      text += "" if admissible else f" (the gate of {ours} failed: speed not admissible)"
    lines.append(text)
  return "\n".join(lines)


def report(cfg, rows_by_part: dict) -> str:
  out = []
  for part, rows in rows_by_part.items():
    r0 = rows[0]
    peer = r0["extra"]["peer"]
    head = (
      f"device={r0['device']} jax={r0['jax_version']} torch={peer['torch']} "
      f"transformers={peer['transformers']} dtype={cfg.dtype} batch=1 greedy legs={cfg.legs} "
      f"(interleaved; request 0 of each leg discarded) prompts/leg={r0['n_prompts']} "
      f"max_new_tokens={r0['max_new_tokens']}"
    )
    if part == "shape":
      s = cfg.shape
      title = f"### shape: {r0['target']}, prompt {s.prompt_tokens} random tokens"
      compiled = [r["extra"].get("compiled") for r in rows if r["method"] == "hf_static"]
      head += f" hf_static compiled={all(compiled)}"
      table = part_table(rows, SHAPE_PAIRS, s.bar)
    else:
      z = cfg.zoo
      title = f"### zoo: {z.target} + {z.draft}, HumanEval (right-stripped), k={z.k}"
      table = part_table(rows, ZOO_PAIRS, z.bar)
    out += [title, "", head, "", table, ""]
  return "\n".join(out)


def run(cfg, out_dir: str) -> str:
  """Runs the configured parts, writes OUT/results.jsonl and OUT/peers.md, returns the Markdown."""
  cfg = normalize(cfg)
  validate(cfg)
  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", JAX_MEM_FRACTION)
  out = results.prepare_out_dir(out_dir)
  path = out / results.RESULTS_NAME
  if path.exists():
    raise PeerError(f"{path} already holds results; use a new --out")
  sink = functools.partial(results.append_row, path)
  rows_by_part = {}
  with TorchPeer(cfg.torch_python, cfg.torch_device) as peer:
    for part in cfg.parts:
      run_part = run_shape if part == "shape" else run_zoo
      rows_by_part[part] = run_part(cfg, peer, sink)
  text = report(cfg, rows_by_part)
  (out / "peers.md").write_text(text + "\n")
  return text
