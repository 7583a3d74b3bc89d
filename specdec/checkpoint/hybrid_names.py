"""HF tensor names of the hybrid targets (Qwen3-Next, Qwen3-MoE) beyond the dense table.

The attention, dense-MLP, norm, embedding and head tensors go through `names.NAME_TABLE`; this
adds the Gated DeltaNet, router and shared-expert rows, and stacks the per-expert matrices
`model.layers.{i}.mlp.experts.{j}.{gate,up,down}_proj.weight` into one (in, out) array per layer
and projection, [I, D, F] or [I, F, D], checking that experts 0 .. I-1 are all there
(`unstack_experts` writes them back one tensor each). The same rows name the Qwen3-Next MTP
head's layer under `mtp.layers.0.` (specdec.drafters.mtp). Qwen3.5 splits the Gated DeltaNet
input projections; `fuse_split_gdn` regroups them into Qwen3-Next's two.
"""

import os
import re

import numpy as np

from specdec.checkpoint import names
from specdec.checkpoint.safetensors_io import CheckpointError
from specdec.models.config import QWEN3_5, HybridConfig

_L = r"model\.layers\.(\d+)\."
_LIN = "layer_{0}/linear_attn/"
_SHARED = "layer_{0}/mlp/shared_expert/{1}_proj/kernel"
HYBRID_TABLE: tuple[tuple[str, str, bool], ...] = (
  (_L + r"linear_attn\.(in_proj_qkvz|in_proj_ba|out_proj)\.weight", _LIN + "{1}/kernel", True),
  (_L + r"linear_attn\.conv1d\.weight", _LIN + "conv1d", False),
  (_L + r"linear_attn\.(A_log|dt_bias)", _LIN + "{1}", False),
  (_L + r"linear_attn\.norm\.weight", _LIN + "norm", False),
  (_L + r"mlp\.gate\.weight", "layer_{0}/mlp/router/kernel", True),
  (_L + r"mlp\.shared_expert\.(gate|up|down)_proj\.weight", _SHARED, True),
  (_L + r"mlp\.shared_expert_gate\.weight", "layer_{0}/mlp/shared_expert_gate/kernel", True),
)  # fmt: skip
_COMPILED = tuple((re.compile(p + r"\Z"), t, tr) for p, t, tr in HYBRID_TABLE)
_EXPERT = r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight\Z"
_SPLIT_GDN = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
STACKED = "stacked:"  # the prefix of the names `stack_experts` gives the arrays it builds
_STACKED_PATH = re.compile(r"layer_(\d+)/mlp/experts/(gate|up|down)_proj\Z")


def to_path(hf_name: str) -> tuple[str, bool] | None:
  """HF name (or a stacked expert name) -> (params path, transpose), None if unknown."""
  if hf_name.startswith(STACKED):
    return hf_name[len(STACKED) :], False
  found = names.to_path(hf_name)
  if found is not None:
    return found
  for regex, template, transpose in _COMPILED:
    m = regex.match(hf_name)
    if m:
      return template.format(*m.groups()), transpose
  return None


def to_hf_name(path: str) -> tuple[str, bool]:
  """params path -> (HF name, transpose), the inverse of `to_path` for unstacked tensors."""
  try:
    return names.to_hf_name(path)
  except KeyError:
    return names.to_hf_name(path, HYBRID_TABLE)


def unstack_experts(path: str, stacked, prefix: str = "model.") -> dict[str, np.ndarray] | None:
  """The inverse of `stack_experts` for one params path: the layer's per-expert HF tensors, each
  stored (out, in); None where `path` holds no stacked experts. prefix: as `stack_experts`'s."""
  m = _STACKED_PATH.match(path)
  if m is None:
    return None
  a = np.asarray(stacked)
  name = f"{prefix}layers.{m[1]}.mlp.experts.{{}}.{m[2]}_proj.weight"
  return {name.format(j): np.ascontiguousarray(a[j].T) for j in range(a.shape[0])}


def stack_experts(
  arrays: dict, files: dict, config: HybridConfig, prefix: str = "model."
) -> tuple[dict, dict]:
  """(arrays, files) with each layer's per-expert matrices replaced by their (in, out) stack;
  prefix: what precedes `layers.{i}.` in the names (`mtp.` for the MTP head's layer)."""
  expert = re.compile(re.escape(prefix) + _EXPERT)
  groups: dict[tuple[int, str], dict[int, str]] = {}
  for name in arrays:
    m = expert.match(name)
    if m:
      groups.setdefault((int(m[1]), m[3]), {})[int(m[2])] = name
  arrays, files = dict(arrays), dict(files)
  for (layer, proj), by_expert in sorted(groups.items()):
    first = by_expert[min(by_expert)]
    if layer >= config.num_layers or not config.moe_layers[layer]:
      raise CheckpointError(
        f"{files[first]}: unexpected tensor {first!r}: layer {layer} has no routed experts "
        "in this config"
      )
    want = set(range(config.num_experts))
    if set(by_expert) != want:
      extra, missing = sorted(set(by_expert) - want), sorted(want - set(by_expert))
      first_missing = (
        f"; missing tensor '{prefix}layers.{layer}.mlp.experts.{missing[0]}.{proj}_proj.weight'"
        if missing
        else ""
      )
      raise CheckpointError(
        f"{files[first]}: layer {layer} {proj}_proj has experts "
        f"{min(by_expert)}..{max(by_expert)} ({len(by_expert)} of them) but config.json says "
        f"num_experts={config.num_experts} (missing {missing[:4]}, unexpected {extra[:4]})"
        + first_missing
      )
    shapes = {arrays[by_expert[j]].shape for j in want}
    if len(shapes) != 1:
      raise CheckpointError(
        f"{files[first]}: layer {layer} {proj}_proj experts have differing shapes {sorted(shapes)}"
      )
    stacked = np.stack([arrays.pop(by_expert[j]).T for j in sorted(want)])
    key = f"{STACKED}layer_{layer}/mlp/experts/{proj}_proj"
    arrays[key], files[key] = stacked, files[first]
  return arrays, files


def fuse_split_gdn(
  arrays: dict, files: dict, config: HybridConfig, prefix: str = "model."
) -> tuple[dict, dict]:
  """(arrays, files) with Qwen3.5's in_proj_{qkv, z, b, a} of each linear layer replaced by the
  Qwen3-Next in_proj_qkvz / in_proj_ba they regroup into: per key head i, [q_i, k_i, v and z of
  its r value heads] and [b, a of those heads]. Qwen3.5's conv runs over [q, k, v] as Qwen3-Next's
  does, so conv1d is unchanged. Each missing or mis-shaped piece is named. prefix: what precedes
  `layers.{i}.` in the names (`model.language_model.` in the vision-language wrapper)."""
  if config.model_type not in QWEN3_5:
    return arrays, files
  Q, Y = config.linear_num_key_heads, config.linear_num_value_heads
  H, U, D = config.linear_key_head_dim, config.linear_value_head_dim, config.hidden_size
  r = Y // Q
  want = dict(zip(_SPLIT_GDN, ((2 * Q * H + Y * U, D), (Y * U, D), (Y, D), (Y, D)), strict=True))
  arrays, files = dict(arrays), dict(files)
  for layer in config.linear_layers:
    module = f"{prefix}layers.{layer}.linear_attn."
    parts = {}
    for piece, shape in want.items():
      name = module + piece + ".weight"
      if name not in arrays:
        where = os.path.dirname(next(iter(files.values()), "")) or "checkpoint"
        raise CheckpointError(
          f"{where}: missing tensor {name!r} (a {config.model_type} linear layer)"
        )
      if arrays[name].shape != shape:
        raise CheckpointError(
          f"{files[name]}: tensor {name!r} has shape {arrays[name].shape}, expected {shape} "
          "from config.json"
        )
      parts[piece] = arrays.pop(name)
      file = files.pop(name)
    qkv = parts["in_proj_qkv"]
    q_QHD = qkv[: Q * H].reshape(Q, H, D)
    k_QHD = qkv[Q * H : 2 * Q * H].reshape(Q, H, D)
    v_QXD = qkv[2 * Q * H :].reshape(Q, r * U, D)
    z_QXD = parts["in_proj_z"].reshape(Q, r * U, D)
    qkvz = np.concatenate([q_QHD, k_QHD, v_QXD, z_QXD], 1).reshape(-1, D)
    ba = np.concatenate(
      [parts["in_proj_b"].reshape(Q, r, D), parts["in_proj_a"].reshape(Q, r, D)], 1
    ).reshape(-1, D)
    for piece, array in (("in_proj_qkvz", qkvz), ("in_proj_ba", ba)):
      arrays[module + piece + ".weight"], files[module + piece + ".weight"] = array, file
  return arrays, files
