"""Sibling projections fused into one matmul each: q/k/v -> qkv_proj, gate/up -> gate_up_proj.

A decode step at small batch is a chain of GEMVs, and every launch has a fixed cost, so one launch
over q, k and v (or gate and up) beats three (or two); docs/benchmarks.md has the measured step.
This is an inference-time transform of the params: `specdec.load` applies it by default (releasing
each layer's separate kernels as it joins them, so two copies never coexist), checkpoints, training
and drafters keep the separate projections, `quantize_model` quantizes each part on its own, and
`specdec.save` refuses a fused model. EXL3 projections stay separate:
each rotates its input by its own sign/scale vector (suh), so no single weight serves their
concatenation.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specdec.quant import fp8, nvfp4
from specdec.quant.apply import quantize_model

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


def _fuse_sublayer(params: dict, fused: str, names: tuple[str, ...], release: bool) -> dict:
  if not all(n in params for n in names):
    return params
  parts = [params[n] for n in names]
  kernel = _concat_out([p["kernel"] for p in parts])
  if kernel is None:
    return params
  new = {"kernel": kernel}
  if "bias" in parts[0]:
    new["bias"] = jnp.concatenate([p["bias"] for p in parts], axis=-1)
  if release:
    jax.block_until_ready(new)
    for leaf in jax.tree.leaves(parts):
      if isinstance(leaf, jax.Array):
        leaf.delete()
  return {**{k: v for k, v in params.items() if k not in names}, fused: new}


def part_sizes(config, fused: str) -> tuple[int, ...]:
  """The output widths of the projections a fused module joins, in FUSED order."""
  N, K, H, F = config.num_heads, config.num_kv_heads, config.head_dim, config.intermediate_size
  return {"qkv_proj": (N * H, K * H, K * H), "gate_up_proj": (F, F)}[fused]


def split_dense(model):
  """A copy of `model` whose dense fused kernels (and biases) are the separate projections again;
  quantized fused kernels are left as they are."""
  params = dict(model.params["params"])
  for i in range(model.config.num_layers):
    layer = dict(params[f"layer_{i}"])
    for sub, (fused, names) in FUSED.items():
      sub_params = dict(layer[sub])
      joined = sub_params.get(fused)
      if joined is None or not isinstance(joined["kernel"], jax.Array | np.ndarray):
        continue
      cuts = np.cumsum(part_sizes(model.config, fused))[:-1].tolist()
      pieces = {name: jnp.split(v, cuts, axis=-1) for name, v in joined.items()}
      del sub_params[fused]
      for j, name in enumerate(names):
        sub_params[name] = {leaf: pieces[leaf][j] for leaf in pieces}
      layer[sub] = sub_params
    params[f"layer_{i}"] = layer
  return dataclasses.replace(model, params={"params": params})


def fuse_projections(model, release: bool = False):
  """A copy of `model` whose q/k/v and gate/up kernels are one matmul each where they can be.

  release=True deletes the separate kernels as each is joined: for a caller that gives `model` up
  (`specdec.load`), so peak memory is the model plus one layer's projections, not two models.
  """
  params = dict(model.params["params"])
  for i in range(model.config.num_layers):
    layer = dict(params[f"layer_{i}"])
    for sub, (fused, names) in FUSED.items():
      layer[sub] = _fuse_sublayer(dict(layer[sub]), fused, names, release)
    params[f"layer_{i}"] = layer
  return dataclasses.replace(model, params={"params": params})


def is_fused(model) -> bool:
  return any(
    name in sub
    for i in range(model.config.num_layers)
    for sub in model.params["params"][f"layer_{i}"].values()
    for name in FUSED_NAMES
  )


def quantized(model, fmt: str, **kw):
  """`quantize_model` of `model`, fused or not: each projection is quantized on its own, as a
  checkpoint's are (a per-tensor scale over q/k/v together would be another quantization), then
  joined again where the format allows."""
  if not is_fused(model):
    return quantize_model(model, fmt, **kw)
  return fuse_projections(quantize_model(split_dense(model), fmt, **kw), release=True)
