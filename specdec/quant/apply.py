"""Quantize a model's linear layers in place of their dense kernels."""

import dataclasses

import jax.numpy as jnp
from flax.traverse_util import flatten_dict, unflatten_dict

from specdec.quant import exl3, fp8, nvfp4
from specdec.quant.base import QuantizedWeight

FORMATS = ("nvfp4", "fp8", "exl3_2", "exl3_3", "exl3_4", "exl3_5", "exl3_6", "exl3_8")
FUSED = ("qkv_proj", "gate_up_proj")  # specdec.models.fuse's joined modules


def quantize_model(model, fmt: str, exclude: tuple[str, ...] = ("lm_head",), seed: int = 0):
  """A copy of `model` whose Linear kernels are NVFP4, FP8 or EXL3 (`exl3_<K>`: K bits per weight)
  weights. Embeddings, norms and the modules in `exclude` stay dense: the LM head is kept at full
  precision as published quantized checkpoints do."""
  if fmt not in FORMATS:
    raise ValueError(f"unknown quantization format {fmt!r}; choose one of {FORMATS}")
  flat = flatten_dict(model.params["params"])
  joined = [k for k in flat if k[-1] == "kernel" and k[-2] in FUSED]
  if joined:
    raise ValueError(
      f"quantize_model: {'/'.join(joined[0][:-1])} is a fused projection; quantize the separate "
      "ones (specdec.models.fuse.quantized does, or load with fuse_projections=False)"
    )
  out = {}
  for key, w in flat.items():
    if key[-1] != "kernel" or key[0] in exclude:
      out[key] = w
    elif fmt == "nvfp4":
      out[key] = nvfp4.quantize(jnp.asarray(w, jnp.float32))
    elif fmt == "fp8":
      out[key] = fp8.quantize(jnp.asarray(w, jnp.float32))
    else:
      bits = int(fmt.split("_")[1])
      out[key] = exl3.quantize_linear(jnp.asarray(w, jnp.float32), bits, key=seed + len(out))
  return dataclasses.replace(model, params={"params": nvfp4.for_device(unflatten_dict(out))})


def dequantized_twin(model):
  """The same model with every quantized kernel expanded to a dense array in the model's dtype."""

  def expand(w):
    return w.dequantize(model.dtype) if isinstance(w, QuantizedWeight) else w

  flat = {k: expand(v) for k, v in flatten_dict(model.params["params"]).items()}
  return dataclasses.replace(model, params={"params": unflatten_dict(flat)})
