"""Sibling projections fused into one matmul each: q/k/v -> qkv_proj, gate/up -> gate_up_proj.

A decode step at small batch is a chain of GEMVs, and every launch has a fixed cost, so one launch
over q, k and v (or gate and up) beats three (or two); docs/benchmarks.md has the measured step.
This is an inference-time transform of the params: checkpoints, training and drafters keep the
separate projections, and `specdec.save` refuses a fused model. EXL3 projections stay separate:
each rotates its input by its own sign/scale vector (suh), so no single weight serves their
concatenation.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict

from specdec.quant import fp8, nvfp4

# Per sublayer: (fused module name, the modules it replaces, in output order).
FUSED = {
  "attn": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
  "mlp": ("gate_up_proj", ("gate_proj", "up_proj")),
}
FUSED_NAMES = tuple(name for name, _ in FUSED.values())


def _concat_out(kernels: list):
  """The kernels joined along `out` (dense, NVFP4 or FP8 alike), or None if they cannot be."""
  if all(isinstance(w, jax.Array | np.ndarray) for w in kernels):
    return jnp.concatenate(kernels, axis=-1)
  for kind in (nvfp4.NVFP4Weight, fp8.FP8Weight):
    if all(isinstance(w, kind) for w in kernels):
      module = nvfp4 if kind is nvfp4.NVFP4Weight else fp8
      return module.concat_columns(kernels)
  return None


def _fuse_sublayer(params: dict, fused: str, names: tuple[str, ...]) -> dict:
  if not all(n in params for n in names):
    return params
  parts = [params[n] for n in names]
  kernel = _concat_out([p["kernel"] for p in parts])
  if kernel is None:
    return params
  new = {"kernel": kernel}
  if "bias" in parts[0]:
    new["bias"] = jnp.concatenate([p["bias"] for p in parts], axis=-1)
  return {**{k: v for k, v in params.items() if k not in names}, fused: new}


def fused_bytes(model) -> int:
  """Bytes `fuse_projections(model)` allocates beside `model` (the joined kernels and biases), from
  shapes alone: the unfused model stays resident while the fused one decodes."""
  shapes = jax.eval_shape(
    lambda p: fuse_projections(dataclasses.replace(model, params=p)).params, model.params
  )
  flat = flatten_dict(shapes["params"])
  return sum(
    x.size * x.dtype.itemsize
    for path, leaf in flat.items()
    if any(name in path for name in FUSED_NAMES)
    for x in jax.tree.leaves(leaf)
  )


def fuse_projections(model):
  """A copy of `model` whose q/k/v and gate/up kernels are one matmul each where they can be."""
  params = dict(model.params["params"])
  for i in range(model.config.num_layers):
    layer = dict(params[f"layer_{i}"])
    for sub, (fused, names) in FUSED.items():
      layer[sub] = _fuse_sublayer(dict(layer[sub]), fused, names)
    params[f"layer_{i}"] = layer
  return dataclasses.replace(model, params={"params": params})
