"""Wall time per decode step and host round trips under four loop variants (bench.loop_sync).

  python -m experiments.bench_loop [--dtype=bfloat16] [--ks=1,4,8,16] [--max_new=48,256] --out=DIR
The zoo target (projections fused) with no drafter and with the zoo draft LM, HumanEval prompts.
"""

import json
import os

import jax.numpy as jnp
from absl import app, flags

import specdec
from specdec import xla_env
from specdec.bench import loop_sync
from specdec.checkpoint.zoo import resolve_path
from specdec.data import workload as workload_lib

_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16"], "model dtype")
_KS = flags.DEFINE_list("ks", ["1", "4", "8", "16"], "draft budgets of the draft_lm arm")
_MAX_NEW = flags.DEFINE_list("max_new", ["48", "256"], "completion budgets")
_PROMPTS = flags.DEFINE_integer("n_prompts", 7, "HumanEval prompts per leg (the first is warm-up)")
_LEGS = flags.DEFINE_integer("legs", 2, "interleaved legs")
_VARIANTS = flags.DEFINE_list("variants", list(loop_sync.VARIANTS), "loop variants")
_OUT = flags.DEFINE_string("out", "runs/bench_loop", "writes OUT/loop.jsonl and OUT/loop.md")


def main(argv):
  del argv
  xla_env.apply_defaults()
  dtype = jnp.dtype(_DTYPE.value)
  target = specdec.load(resolve_path("zoo:target"), dtype=dtype)
  drafters = {
    "null": specdec.drafters.null(),
    "draft_lm": specdec.drafters.draft_lm(specdec.load(resolve_path("zoo:draft_lm"), dtype=dtype)),
  }
  prompts = workload_lib.select(workload_lib.load_workload("humaneval"), _PROMPTS.value)
  ids = [target.encode(p.text) for p in prompts]
  rows = loop_sync.run(
    target, drafters, [int(k) for k in _KS.value], ids, [int(m) for m in _MAX_NEW.value],
    _LEGS.value, tuple(_VARIANTS.value),
  )  # fmt: skip
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "loop.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  table = loop_sync.to_markdown(rows)
  with open(os.path.join(_OUT.value, "loop.md"), "w") as f:
    f.write(table + "\n")
  print(table)


if __name__ == "__main__":
  app.run(main)
