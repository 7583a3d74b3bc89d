"""Host time of lowering the zoo target's verify forward for cuda, on any machine (issue 22): its
layers through `transformer.apply_layer` (one trace and one lowering per layer shape) or as a
Python loop of layer calls, with the Mosaic GPU decode attention kernel or XLA's attention.

  python -m experiments.bench_lowering --out=runs/bench_lowering

Writes OUT/bench_lowering.json: per (layers, attention), the seconds of each repeat of
`jax.export(..., platforms=["cuda"])` after clearing jax's caches, and whether the module holds
the Mosaic GPU kernel. Lowering is host work, one cell after another on the sweep's main
thread: this is its cost per forward on the machine that runs it, GPU or not.
"""

import contextlib
import json
import os
import time
from unittest import mock

import jax
import jax.numpy as jnp
from absl import app, flags

import specdec
from specdec import xla_env
from specdec.checkpoint.zoo import resolve_path
from specdec.models import stack, transformer

_OUT = flags.DEFINE_string("out", "runs/bench_lowering", "output directory")
_TARGET = flags.DEFINE_string("target", "zoo:target", "a dense target (zoo:NAME or a directory)")
_BATCH = flags.DEFINE_integer("batch", 5, "rows")
_WIDTH = flags.DEFINE_integer("width", 5, "new tokens per row (a verify of k = width - 1)")
_SLOTS = flags.DEFINE_integer("slots", 1024, "cache slots (a multiple of 64 for the kernel)")
_REPS = flags.DEFINE_integer("reps", 3, "repeats per arm")

LAYERS = ("apply_layer", "loop")
ATTENTION = ("kernel", "xla")


def _loop(variables, args, *, layer, static=()):
  """`apply_layer` without its jit: every layer traced and lowered on its own."""
  return layer.apply(variables, *args, *static)


def arm(layers: str, attention: str):
  """The patches that make one arm: the kernel path is chosen where jax reports a GPU."""
  patches = contextlib.ExitStack()
  if layers == "loop":
    patches.enter_context(mock.patch.object(transformer, "apply_layer", _loop))
  if attention == "kernel":
    patches.enter_context(mock.patch.object(jax, "default_backend", lambda: "gpu"))
  return patches


def main(argv):
  del argv
  xla_env.apply_defaults()
  model = specdec.load(resolve_path(_TARGET.value), dtype=jnp.bfloat16)
  c, B, T = model.config, _BATCH.value, _WIDTH.value
  cache = stack.empty_cache(c, B, _SLOTS.value, jnp.bfloat16)
  positions_BT = jnp.broadcast_to(_SLOTS.value // 2 + jnp.arange(T, dtype=jnp.int32), (B, T))
  args = (model.params, jnp.zeros((B, T), jnp.int32), positions_BT, cache)

  def verify(params, tokens_BT, positions_BT, cache):
    return stack.decoder(c, jnp.bfloat16).apply(params, tokens_BT, positions_BT, cache).logits

  rows = []
  for layers in LAYERS:
    for attention in ATTENTION:
      seconds = []
      with arm(layers, attention):
        for _ in range(_REPS.value):
          jax.clear_caches()
          t0 = time.perf_counter()
          text = jax.export.export(jax.jit(verify), platforms=["cuda"])(*args).mlir_module()
          seconds.append(time.perf_counter() - t0)
      kernel = "custom_call @mosaic_gpu" in text
      rows.append(dict(layers=layers, attention=attention, seconds=seconds, kernel=kernel))
      print(f"{layers:12s} {attention:6s} {min(seconds):.3f} s (min of {len(seconds)})")
  os.makedirs(_OUT.value, exist_ok=True)
  shape = dict(target=_TARGET.value, layers=c.num_layers, batch=B, width=T, slots=_SLOTS.value)
  with open(os.path.join(_OUT.value, "bench_lowering.json"), "w") as f:
    json.dump({"shape": shape, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  app.run(main)
