"""What the mesh path costs at TP = 1: `specdec.generate` on a random dense target, unsharded
against the same target on a one-device ("data", "tensor") = (1, 1) mesh (issue 27).

  python -m experiments.bench_mesh_overhead --out=$OUT       # Qwen3-8B shape, bf16, B = 1
  python -m experiments.bench_mesh_overhead --tiny --max_new_tokens=16 --legs=2 --out=/tmp/m  # CPU

Per method (plain decoding, ngram at k = 4): `legs` interleaved legs of both arms after one
warm-up leg each (compiles, discarded); each leg's seconds per decode step = decode_s /
loop_steps from generate's stats (host-timed over on-device chunks, one sync per chunk, the same
in both arms). Greedy tokens must be identical between the arms before any ratio is reported.
Writes OUT/bench_mesh_overhead.json: per method, both arms' per-leg step times, the median
ratio mesh / plain, and its range over the legs.
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
from specdec import sharding, xla_env
from specdec.bench import random_models

_OUT = flags.DEFINE_string("out", os.environ.get("OUT", "runs/bench_mesh"), "output directory")
_TINY = flags.DEFINE_bool("tiny", False, "a 1-layer toy shape that runs on a CPU (float32 there)")
_PROMPT = flags.DEFINE_integer("prompt_tokens", 1024, "prompt length")
_NEW = flags.DEFINE_integer("max_new_tokens", 256, "tokens generated per leg")
_LEGS = flags.DEFINE_integer("legs", 5, "measured legs per arm (after one warm-up leg)")

METHODS = {"null": (None, None), "ngram": (specdec.drafters.ngram, 4)}


def one_leg(model, prompt, method: str, mesh):
  make, k = METHODS[method]
  g = specdec.generate(
    model, [prompt], max_new_tokens=_NEW.value, drafter=make() if make else None, k=k, mesh=mesh
  )
  return g.tokens, g.stats["decode_s"] / g.stats["loop_steps"]


def main(argv):
  del argv
  xla_env.apply_defaults()
  shape = TINY if _TINY.value else QWEN3_8B
  config = random_models.model_config(shape)
  dtype = jnp.float32 if _TINY.value and jax.default_backend() == "cpu" else jnp.bfloat16
  plain = random_models.random_model(config, "bf16", dtype)
  mesh = sharding.make_mesh(tensor=1)
  meshed = sharding.on_mesh(plain, mesh)
  rng = np.random.default_rng(0)
  # Repeats give the ngram drafter something to match, as real prompts do.
  prompt = np.tile(rng.integers(2, config.vocab_size, 64), -(-_PROMPT.value // 64))[: _PROMPT.value]
  arms = {"plain": (plain, None), "mesh_tp1": (meshed, mesh)}
  result = dict(
    device=jax.devices()[0].device_kind, backend=jax.default_backend(), jax=jax.__version__,
    dtype=jnp.dtype(dtype).name, batch=1, shape=shape, prompt_tokens=_PROMPT.value,
    max_new_tokens=_NEW.value, legs=_LEGS.value, methods={},
  )  # fmt: skip
  for method in METHODS:
    tokens = {arm: one_leg(m, prompt.tolist(), method, me)[0] for arm, (m, me) in arms.items()}
    if tokens["plain"] != tokens["mesh_tp1"]:
      raise SystemExit(f"{method}: greedy tokens differ between the plain and the mesh path")
    per = {arm: [] for arm in arms}
    for _ in range(_LEGS.value):  # interleaved: plain, mesh, plain, mesh, ...
      for arm, (m, me) in arms.items():
        per[arm].append(one_leg(m, prompt.tolist(), method, me)[1])
    ratios = [b / a for a, b in zip(per["plain"], per["mesh_tp1"], strict=True)]
    result["methods"][method] = dict(
      step_s=per, ratio_median=statistics.median(ratios), ratio_range=[min(ratios), max(ratios)],
      gate="greedy tokens identical",
    )  # fmt: skip
    print(
      f"{method}: plain {1e6 * statistics.median(per['plain']):.1f} us/step, mesh TP=1 "
      f"{1e6 * statistics.median(per['mesh_tp1']):.1f} us/step, ratio median "
      f"{statistics.median(ratios):.4f} (range {min(ratios):.4f}-{max(ratios):.4f})"
    )
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "bench_mesh_overhead.json"), "w") as f:
    json.dump(result, f, indent=1)


if __name__ == "__main__":
  app.run(main)
