"""Draft budget under staged acceptance: fixed k, k="auto" and static trees on a random dense
target, with an oracle drafter whose miss rate is set per position (issue 26).

  python -m experiments.bench_budget --out=$OUT   # Qwen3-8B shape, bf16, B = 1, 1k prompt, 256 new
  python -m experiments.bench_budget --tiny --prompt_tokens=64 --max_new_tokens=32 --legs=2 \\
    --out=/tmp/b                                 # a CPU

Random weights accept no drafter's tokens, so acceptance is staged: the oracle
(`specdec.drafters.oracle`) drafts the target's greedy continuation (one plain greedy decode),
each draft wrong with the profile's miss rate at its position; tree children of rank r > 0 hold
the answer only where the ranks before them missed (a top-k drafter, --rank_scale). Profiles:
high, low (one miss rate for the whole request), high_low / low_high (one rate for the first
--switch of the new tokens, the other after). The default target is `random_models.walk_model`,
whose greedy decode does not change with the verify width in bf16, so the gate can hold at every
width; --target=random takes plain random fills.

--batch B decodes B rows together, each its own random prompt and draft misses: the verify of
B x (k+1) tokens grows with k there, so the best k depends on acceptance (at B = 1 a step costs
about the same at every k and the largest k wins). --temperature T > 0 samples every call; the
walk target's next token outscores the rest by tens of logits, so its samples are the greedy
walk and the same gate applies (acceptance stays the oracle's: p(draft) is 1 or 0).

Arms, per profile: the chains of --ks (and of every tree's verify width), k="auto" (the default
tiers, its cost curve measured once before the legs and recorded), the trees of --trees; plain
decoding once per leg. One warm-up leg (compiles, discarded), then --legs legs, each visiting
every arm before the next starts. Every call's tokens must equal the plain greedy decode, else
the arm's figures are withheld. Per arm: tau (emitted tokens / target forwards) and decode tok/s
per row (tokens after the first / decode time), median and range over legs. Per profile: auto /
the best fixed k (paired by leg), each tree against the chain of its verify width and the best
chain.
Writes OUT/bench_budget.json and prints a table.
"""

import json
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import specdec
from configs.bench_decode import QWEN3_8B, TINY
from specdec import metrics, xla_env
from specdec.bench import random_models
from specdec.decoding import step_costs
from specdec.decoding.budget import Budget
from specdec.decoding.generate import cache_slots, prompt_bucket
from specdec.decoding.tree import binary_paths, tree
from specdec.drafters.oracle import miss_profile, oracle
from specdec.lab import results
from specdec.lab.trees import PRESETS
from specdec.models.fuse import fuse_projections

_OUT = flags.DEFINE_string("out", os.environ.get("OUT", "runs/bench_budget"), "output directory")
_TINY = flags.DEFINE_bool("tiny", False, "a 1-layer toy shape that runs on a CPU (float32 there)")
_TARGET = flags.DEFINE_enum("target", "walk", ["walk", "random"], "random_models target")
_FUSE = flags.DEFINE_bool("fuse", True, "fuse q/k/v and gate/up, as specdec.load does")
_BATCH = flags.DEFINE_integer("batch", 1, "rows per call, each its own random prompt and misses")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "sampling temperature of every call")
_PROMPT = flags.DEFINE_integer("prompt_tokens", 1024, "prompt length")
_NEW = flags.DEFINE_integer("max_new_tokens", 256, "tokens generated per call")
_LEGS = flags.DEFINE_integer("legs", 3, "measured legs (after one warm-up leg)")
_KS = flags.DEFINE_list("ks", ["1", "2", "4", "8"], "fixed chain lengths")
_TREES = flags.DEFINE_list(
  "trees", ["binary3", "binary5", "binary9"],
  f"trees: presets of specdec/lab/trees.py ({', '.join(PRESETS)}) or binaryN, the breadth-first "
  "binary tree of N nodes (verify width N, beside the chain k = N - 1)",
)  # fmt: skip
_PROFILES = flags.DEFINE_list("profiles", ["high", "low", "high_low"], "acceptance profiles")
_MISS_HIGH = flags.DEFINE_float("miss_high", 0.1, "miss rate of high acceptance")
_MISS_LOW = flags.DEFINE_float("miss_low", 0.7, "miss rate of low acceptance")
_SWITCH = flags.DEFINE_float("switch", 0.5, "share of the new tokens before a profile changes")
_RANK_SCALE = flags.DEFINE_float("rank_scale", 0.5, "a tree rank's hit rate, relative per rank")
_STEP_COSTS = flags.DEFINE_list("step_costs", [], "auto's cost curve per tier; empty: measured")

# (first, after the switch): acceptance from --miss_high / --miss_low
PROFILES = {
  "high": ("high", "high"), "low": ("low", "low"), "high_low": ("high", "low"),
  "low_high": ("low", "high"),
}  # fmt: skip
PLAIN = ("-", "plain")  # the plain decoding cell, one per leg


def parse_tree(spec: str):
  if spec in PRESETS:
    return tree(PRESETS[spec])
  if spec.startswith("binary") and spec[6:].isdigit() and int(spec[6:]) >= 2:
    return tree(binary_paths(int(spec[6:])))
  raise ValueError(f"--trees: unknown tree {spec!r}; a preset ({', '.join(PRESETS)}) or binaryN")


def walk(next_V, token: int, n: int) -> list[int]:
  """The walk target's greedy continuation of `token`: n tokens."""
  out = [int(next_V[token])]
  while len(out) < n:
    out.append(int(next_V[out[-1]]))
  return out


def spread(values) -> dict:
  """Median and range over legs; None where there are none or a figure is withheld."""
  if not values or any(v is None for v in values):
    return dict(median=None, range=None)
  return dict(median=statistics.median(values), range=[min(values), max(values)])


def paired(num, den) -> dict:
  """Leg-by-leg ratios num / den: median and range (None unless both have every leg)."""
  if not num or not den or len(num) != len(den) or any(v is None for v in num + den):
    return dict(median=None, range=None)
  return spread([a / b for a, b in zip(num, den, strict=True)])


def first_difference(rows, answers) -> int:
  """The first position at which a row's tokens leave its answer (or either ends)."""
  return min(
    next((i for i, (x, y) in enumerate(zip(t, a, strict=False)) if x != y), min(len(t), len(a)))
    for t, a in zip(rows, answers, strict=True)
    if t != a
  )


def one_call(model, prompts, answers, drafter, arm, seed, costs) -> dict:
  """One generate call of an arm: its figures, and whether every row's tokens equal its answer."""
  kw = {}
  if arm == "auto":
    kw = dict(k="auto", step_costs=costs)
  elif arm.startswith("k="):
    kw = dict(k=int(arm[2:]))
  elif arm != "plain":
    kw = dict(tree=parse_tree(arm).paths)
  g = specdec.generate(
    model, prompts, max_new_tokens=len(answers[0]), temperature=_TEMPERATURE.value,
    drafter=drafter if kw else None, seed=seed, **kw,
  )  # fmt: skip
  s = g.stats
  n_B = [len(t) for t in g.tokens]
  tpot_B = metrics.tpot_ms(1e3 * (s["prefill_s"] + s["decode_s"]), 1e3 * s["prefill_s"], n_B)
  out = dict(
    identical=g.tokens == answers, tau=s["tau"], tok_s=metrics.decode_tok_s(tpot_B),
    steps=s["steps"], alpha=s["alpha"], compiles=s["compiles"],
  )  # fmt: skip
  if not out["identical"]:
    out["first_difference"] = first_difference(g.tokens, answers)
  if arm == "auto":
    out |= dict(mean_k=s["mean_k"], tier_hist=s["tier_hist"], k_trace=s["k_trace"])
  return out


def summarize(head: dict, profiles, ks, trees, legs: dict, failed: set) -> dict:
  """The result: per profile and arm the legs' figures, auto / best fixed k, trees vs chains."""

  def arm_row(cell, width):
    ok, rs = cell not in failed, legs[cell]
    out = dict(
      verify_width=width, gate="greedy tokens identical" if ok else "FAILED", legs=rs,
      tau=spread([r["tau"] for r in rs]), tok_s=spread([r["tok_s"] if ok else None for r in rs]),
      alpha=spread([r["alpha"] for r in rs]), vs_plain=paired(tok_s(cell), tok_s(PLAIN)),
    )  # fmt: skip
    if cell[1] == "auto":
      out["mean_k"] = spread([r["mean_k"] for r in rs])
    return out

  def tok_s(cell):
    return None if cell in failed else [r["tok_s"] for r in legs[cell]]

  def tau(cell):
    return None if cell in failed else [r["tau"] for r in legs[cell]]

  out = dict(head, plain=arm_row(PLAIN, 1), profiles={})
  for p, (early, late) in profiles.items():
    rows = {f"k={k}": arm_row((p, f"k={k}"), k + 1) for k in ks}
    rows["auto"] = arm_row((p, "auto"), f"2-{max(head['tiers']) + 1}")
    rows |= {spec: arm_row((p, spec), t.size) for spec, t in trees.items()}
    chains = {k: rows[f"k={k}"]["tok_s"]["median"] for k in ks}
    gated = {k: v for k, v in chains.items() if v is not None}
    best = metrics.best_k(list(gated), list(gated.values())) if gated else None
    best_cell = (p, f"k={best}")
    auto = paired(tok_s((p, "auto")), tok_s(best_cell) if best else None)
    med, changes = auto["median"], early != late
    tree_rows = {
      spec: dict(
        matched_chain=f"k={t.size - 1}",
        tau_vs_matched=paired(tau((p, spec)), tau((p, f"k={t.size - 1}"))),
        tok_s_vs_matched=paired(tok_s((p, spec)), tok_s((p, f"k={t.size - 1}"))),
        tok_s_vs_best_chain=paired(tok_s((p, spec)), tok_s(best_cell) if best else None),
      )
      for spec, t in trees.items()
    }
    out["profiles"][p] = dict(
      miss=[head["miss"][early], head["miss"][late]], acceptance_changes=changes, arms=rows,
      best_fixed_k=best, auto_vs_best_fixed=auto, trees=tree_rows,
      # issue 26: auto >= 0.97x the best fixed k everywhere, > 1.0x where acceptance changes
      bar_met=None if med is None else med >= 0.97 and (med > 1.0 or not changes),
    )  # fmt: skip
  return out


def main(argv):
  del argv
  xla_env.apply_defaults()
  if _LEGS.value < 1:
    raise app.UsageError("--legs must be >= 1 (the warm-up leg comes on top)")
  if set(_PROFILES.value) - set(PROFILES):
    raise app.UsageError(f"--profiles: choose from {', '.join(PROFILES)}")
  shape = TINY if _TINY.value else QWEN3_8B
  config = random_models.model_config(shape)
  dtype = jnp.float32 if _TINY.value and jax.default_backend() == "cpu" else jnp.bfloat16
  if _TARGET.value == "walk":
    model, next_V = random_models.walk_model(config, dtype)
  else:
    model, next_V = random_models.random_model(config, "bf16", dtype), None
  model = fuse_projections(model) if _FUSE.value else model
  profiles = {p: PROFILES[p] for p in _PROFILES.value}
  trees = {spec: parse_tree(spec) for spec in _TREES.value}
  ks = sorted({int(k) for k in _KS.value} | {t.size - 1 for t in trees.values()})
  new, switch = _NEW.value, round(_SWITCH.value * _NEW.value)
  miss = {"high": _MISS_HIGH.value, "low": _MISS_LOW.value}

  rng, P = np.random.default_rng(0), _PROMPT.value
  prompts = [rng.integers(0, config.vocab_size, P).tolist() for _ in range(_BATCH.value)]
  answers = specdec.generate(model, prompts, max_new_tokens=new).tokens  # plain greedy
  walk_ok = None
  if next_V is not None:
    walk_ok = all(walk(next_V, p[-1], new) == a for p, a in zip(prompts, answers, strict=True))
  rows = [p + a for p, a in zip(prompts, answers, strict=True)]
  drafters = {
    p: oracle(
      rows, config.vocab_size,
      miss_profile([P] * len(rows), len(rows[0]), miss[a], miss[b], switch),
      rank_scale=_RANK_SCALE.value,
    )
    for p, (a, b) in profiles.items()
  }  # fmt: skip
  budget = Budget()
  if _STEP_COSTS.value:
    costs = budget.check_costs([float(c) for c in _STEP_COSTS.value])
  else:  # measured (or loaded) as generate would, recorded here
    slots = cache_slots(prompt_bucket(P), new, budget.k_max)
    drafter = next(iter(drafters.values()))
    costs = step_costs.cost_curve(model, drafter, budget, len(prompts), slots, P)
  head = dict(
    **results.environment_fields(), backend=jax.default_backend(), dtype=jnp.dtype(dtype).name,
    batch=len(prompts), temperature=_TEMPERATURE.value, shape=shape, target=_TARGET.value,
    fuse=_FUSE.value, walk_matches_greedy=walk_ok,
    prompt_tokens=P, max_new_tokens=new, legs=0, rank_scale=_RANK_SCALE.value,
    miss=miss, switch_at=switch, tiers=list(budget.tiers), cost_curve_us=(1e6 * costs).tolist(),
    cost_curve="given" if _STEP_COSTS.value else "measured",
  )  # fmt: skip

  arms = [f"k={k}" for k in ks] + ["auto"] + list(trees)
  cells = [PLAIN] + [(p, arm) for p in profiles for arm in arms]
  legs, failed = {cell: [] for cell in cells}, set()
  os.makedirs(_OUT.value, exist_ok=True)
  for leg in range(_LEGS.value + 1):  # leg 0 compiles: gated, not timed
    for p, arm in cells:
      if (p, arm) in failed:
        continue
      r = one_call(model, prompts, answers, drafters.get(p), arm, leg, costs)
      if not r["identical"]:
        failed.add((p, arm))
      if leg:
        legs[(p, arm)].append(r)
      gate = "" if r["identical"] else f", GATE FAILED at token {r['first_difference']}"
      print(f"leg {leg} {p} {arm}: tau {r['tau']:.2f}, {r['tok_s']:.1f} tok/s{gate}", flush=True)
    if leg:  # every finished leg is on disk, in case the run is cut short
      result = summarize(dict(head, legs=leg), profiles, ks, trees, legs, failed)
      with open(os.path.join(_OUT.value, "bench_budget.json"), "w") as f:
        json.dump(result, f, indent=1)
  print_table(result)


def _fmt(s: dict, digits: int) -> str:
  if s["median"] is None:
    return "n/a†"
  lo, hi = s["range"]
  return f"{s['median']:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def print_table(result: dict) -> None:
  plain = result["plain"]["tok_s"]
  print(
    f"{result['device']}, {result['dtype']}, {result['target']} target, B = {result['batch']}, "
    f"T = {result['temperature']}, prompt {result['prompt_tokens']}, {result['max_new_tokens']} "
    f"new, {result['legs']} legs; plain {_fmt(plain, 1)} tok/s per row; auto's cost curve "
    f"(us/step at k = {result['tiers']}): " + ", ".join(f"{c:.0f}" for c in result["cost_curve_us"])
  )
  for p, r in result["profiles"].items():
    early, late = r["miss"]
    when = f"miss {early}"
    if early != late:
      when += f" for the first {result['switch_at']} new tokens, then {late}"
    print(f"\n{p} ({when})")
    print(
      f"{'arm':<8} {'width':>5}  {'tau (range)':<18} {'tok/s (range)':<26} {'x plain':>7}  gate"
    )
    for arm, a in r["arms"].items():
      vs = a["vs_plain"]["median"]
      extra = f"  mean k {_fmt(a['mean_k'], 2)}" if arm == "auto" else ""
      print(
        f"{arm:<8} {a['verify_width']!s:>5}  {_fmt(a['tau'], 2):<18} {_fmt(a['tok_s'], 1):<26} "
        f"{'n/a' if vs is None else f'{vs:.2f}':>7}  {a['gate']}{extra}"
      )
    bar = {True: "met", False: "not met", None: "n/a"}[r["bar_met"]]
    want = "> 1.0" if r["acceptance_changes"] else ">= 0.97"
    auto = _fmt(r["auto_vs_best_fixed"], 3)
    print(f"auto / best fixed (k={r['best_fixed_k']}): {auto}; bar {want}: {bar}")
    for spec, t in r["trees"].items():
      print(
        f"{spec} vs {t['matched_chain']}: tau {_fmt(t['tau_vs_matched'], 2)}, tok/s "
        f"{_fmt(t['tok_s_vs_matched'], 2)}; vs the best chain {_fmt(t['tok_s_vs_best_chain'], 2)}"
      )
  print("\nmedian (range) over legs; n/a†: withheld, the arm's greedy gate failed")


if __name__ == "__main__":
  app.run(main)
