"""The Qwen3-Next MTP head's decoder layer over a hybrid target, and its routed experts.

vLLM and SGLang (both `qwen3_next_mtp.py`) build the head's one layer as the family's decoder
layer at index 0 forced to full attention: gated attention with partial RoPE and zero-centred
norms, and the routed-expert block where the target's own rule puts one at layer 0
(num_experts > 0, 0 not in mlp_only_layers, decoder_sparse_step 1), else the dense MLP of
intermediate_size. Its experts ship one tensor each,
`mtp.layers.0.mlp.experts.{j}.{gate,up,down}_proj.weight`, and are stacked [I, in, out] as the
target loader stacks the target's (`hybrid_names.stack_experts`).
"""

import numpy as np

from specdec.checkpoint import hybrid_names
from specdec.checkpoint.safetensors_io import CheckpointError, checkpoint_files
from specdec.models.config import HybridConfig

PROJECTIONS = ("gate", "up", "down")
_EXPERTS = "layer_0/mlp/experts/"


def layer_config(c: HybridConfig) -> HybridConfig:
  """The one-layer config of the head's layer: full attention, the MLP of the target's layer 0."""
  return c.replace(num_layers=1, layer_types=("full_attention",), moe_layers=c.moe_layers[:1])


def is_stacked(path: str) -> bool:
  """Whether a head params path is a stack of per-expert tensors (no single published name)."""
  return path.startswith(_EXPERTS)


def expert_names(c: HybridConfig) -> tuple[str, ...]:
  """The per-expert tensors the head's layer owns (none where its MLP is dense)."""
  if not layer_config(c).moe_layers[0]:
    return ()
  return tuple(
    f"mtp.layers.0.mlp.experts.{j}.{p}_proj.weight"
    for j in range(c.num_experts)
    for p in PROJECTIONS
  )


def read_experts(path: str, found: dict, c: HybridConfig, shapes: dict) -> dict[str, np.ndarray]:
  """{params path: float32 [I, in, out]} from the per-expert tensors `found` (name -> array);
  a missing or mis-shaped expert is a CheckpointError naming the tensor."""
  if not found:
    names = expert_names(c)
    if names:
      raise CheckpointError(f"{path}: missing tensor {names[0]!r} (every routed expert)")
    return {}
  files = checkpoint_files(path)
  for name, array in found.items():
    if array.dtype.name not in ("float32", "float16", "bfloat16"):
      raise CheckpointError(
        f"{files[name]}: tensor {name!r} has dtype {array.dtype.name}; expected a float dtype"
      )
  arrays, _ = hybrid_names.stack_experts(found, files, layer_config(c), prefix="mtp.")
  out = {}
  for p in PROJECTIONS:
    key, first = _EXPERTS + f"{p}_proj", f"mtp.layers.0.mlp.experts.0.{p}_proj.weight"
    stacked = arrays.get(hybrid_names.STACKED + key)
    if stacked is None:
      raise CheckpointError(f"{path}: missing tensor {first!r} (every expert of {p}_proj)")
    if stacked.shape != shapes[key]:
      raise CheckpointError(
        f"{files[first]}: tensor {first!r} has shape {stacked.shape[1:][::-1]}, expected "
        f"{shapes[key][1:][::-1]} from config.json"
      )
    out[key] = stacked.astype(np.float32)
  return out
