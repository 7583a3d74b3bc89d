"""Verify cost of an N-node draft tree against a chain of width N, random dense target (issue 26).

  python -m experiments.bench_tree_verify --out=$OUT        # Qwen3-8B shape, bf16, B = 1, 1k and 8k
  python -m experiments.bench_tree_verify --tiny --contexts=64 --widths=4 --out=/tmp/t   # a CPU

Writes OUT/bench_tree_verify.json: per context and width N, the target forward over N positions
(1) as a chain by the step's default attention path (the Pallas decode kernel on a GPU), (2) as a
chain through XLA attention (SPECDEC_ATTENTION=xla), (3) as an N-node tree under its mask by the
default path (on a GPU the kernel over the committed prefix, the node window in jnp), each in
microseconds and relative to the width-1 forward. (3) / (1) is what a tree pays against a chain of
its width. The tree is the breadth-first
binary tree of N nodes (`binary_paths`). Every time is a slope over an on-device loop
(specdec.bench.timing.per_iteration), so dispatch cancels.
"""

import contextlib
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from configs.bench_decode import QWEN3_8B, TINY
from specdec import xla_env
from specdec.bench import random_models, timing
from specdec.decoding import tree as tree_lib
from specdec.ops.attention import TreeMask

_OUT = flags.DEFINE_string("out", os.environ.get("OUT", "runs/bench_tree"), "output directory")
_TINY = flags.DEFINE_bool("tiny", False, "a 1-layer toy shape that runs on a CPU (float32 there)")
_CONTEXTS = flags.DEFINE_list("contexts", ["1024", "8192"], "committed tokens before the verify")
_WIDTHS = flags.DEFINE_list("widths", ["4", "8", "16", "32", "64"], "nodes verified (N)")
_STEPS = flags.DEFINE_integer("n_steps", 16, "iterations of the shorter timed loop")
_REPS = flags.DEFINE_integer("reps", 5, "repetitions per timing (median)")

ARMS = ("chain", "chain_xla", "tree")


@contextlib.contextmanager
def attention(path: str):
  """SPECDEC_ATTENTION for the calls inside (read when a forward is traced)."""
  old = os.environ.get("SPECDEC_ATTENTION")
  os.environ["SPECDEC_ATTENTION"] = "xla" if path == "xla" else ""
  try:
    yield
  finally:
    if old is None:
      os.environ.pop("SPECDEC_ATTENTION")
    else:
      os.environ["SPECDEC_ATTENTION"] = old


@functools.partial(jax.jit, static_argnames=("module", "n", "arm", "tree"))
def verify_loop(params, cache, tokens_BT, root_B, module, n, arm, tree):
  """n forwards over N positions after the root; `tree` (a Tree) for the tree arm, else a chain."""
  if arm == "tree":
    positions_BT = root_B[:, None] + jnp.asarray(tree.depths)[None, :]
    mask = dict(tree=TreeMask(root_B, np.arange(tree.size), tree.ancestors))
  else:
    positions_BT = root_B[:, None] + jnp.arange(tokens_BT.shape[1], dtype=jnp.int32)
    mask = {}

  def body(i, carry):
    cache, acc = carry
    out = module.apply(params, tokens_BT, positions_BT, cache, **mask)
    return out.cache, acc + jnp.argmax(out.logits, -1).sum()  # keeps the LM head in the loop

  return jax.lax.fori_loop(0, n, body, (cache, jnp.int32(0)))


def time_arm(model, cache, ctx: int, width: int, arm: str, n: int, reps: int) -> float:
  """Seconds per forward of `width` positions in `arm` at context ctx."""
  tree = tree_lib.tree(tree_lib.binary_paths(width)) if arm == "tree" and width > 1 else None
  arm = arm if tree is not None else "chain"
  tokens_BT = (jnp.arange(width, dtype=jnp.int32)[None] * 7919 + ctx) % model.config.vocab_size
  root_B = jnp.full((1,), ctx - 1, jnp.int32)
  run = functools.partial(verify_loop, model.params, cache, tokens_BT, root_B, model.module)
  with attention("xla" if arm == "chain_xla" else "auto"):
    per, _ = timing.per_iteration(lambda m: run(n=m, arm=arm, tree=tree), n, 2 * n, reps)
  return per


def main(argv):
  del argv
  xla_env.apply_defaults()
  shape = TINY if _TINY.value else QWEN3_8B
  config = random_models.model_config(shape)
  dtype = jnp.float32 if _TINY.value and jax.default_backend() == "cpu" else jnp.bfloat16
  contexts = [int(x) for x in _CONTEXTS.value]
  widths = sorted(int(x) for x in _WIDTHS.value)
  n, reps = _STEPS.value, _REPS.value
  model = random_models.random_model(config, "bf16", dtype)
  slots = max(contexts) + max(widths) + 1
  cache = random_models.synthetic_state(config, 1, slots, max(contexts), 0, dtype).cache
  result = dict(
    device=jax.devices()[0].device_kind, backend=jax.default_backend(), jax=jax.__version__,
    dtype=jnp.dtype(dtype).name, batch=1, shape=shape, n_steps=n, reps=reps,
    tree="breadth-first binary (binary_paths)", contexts=[],
  )  # fmt: skip
  for ctx in contexts:
    base = time_arm(model, cache, ctx, 1, "chain", n, reps)
    rows = {}
    for w in widths:
      t = {arm: time_arm(model, cache, ctx, w, arm, n, reps) for arm in ARMS}
      rows[str(w)] = dict(
        **{f"{arm}_us": 1e6 * t[arm] for arm in ARMS},
        **{f"{arm}_vs_width1": t[arm] / base for arm in ARMS},
        tree_vs_chain=t["tree"] / t["chain"], tree_vs_chain_xla=t["tree"] / t["chain_xla"],
        tree_depth=tree_lib.tree(tree_lib.binary_paths(w)).depth if w > 1 else 0,
      )  # fmt: skip
    result["contexts"].append(dict(context=ctx, width1_us=1e6 * base, widths=rows))
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "bench_tree_verify.json"), "w") as f:
    json.dump(result, f, indent=1)
  for c in result["contexts"]:
    print(f"context {c['context']}: width-1 forward {c['width1_us']:.1f} us")
    print("   N  depth   chain us  chain_xla us   tree us  tree/chain  tree/chain_xla")
    for w, r in c["widths"].items():
      print(
        f"{w:>4} {r['tree_depth']:>6} {r['chain_us']:>10.1f} {r['chain_xla_us']:>13.1f} "
        f"{r['tree_us']:>9.1f} {r['tree_vs_chain']:>11.2f} {r['tree_vs_chain_xla']:>15.2f}"
      )


if __name__ == "__main__":
  app.run(main)
