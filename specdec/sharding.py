"""Tensor parallelism through jax.sharding: a ("data", "tensor") mesh, each weight's logical axes
read from its module name, and the model's params placed by them.

Column-parallel projections (q, k, v, gate, up, the LM head) split their output features over
"tensor", row-parallel ones (o, down) their input features, so each device holds whole heads and
whole MLP columns; norms and the embedding are replicated. The step is the same jitted function:
XLA's SPMD partitioner inserts the reductions dense weights need (quantized ones run per device
in specdec.ops.qmatmul's `shard_map`, by `split_of`), and the KV cache follows the k/v
projections (sharded by kv heads). Drafters stay replicated. NVFP4, FP8 and EXL3 weights split
by the same rule: a row-parallel NVFP4 weight only where each shard holds whole 16-wide scale
groups, an EXL3 weight only where each shard holds whole 128-point Hadamard blocks along the split
dimension (its rotations are block-diagonal at 128, so a shard's rotation is its own; whole blocks
are whole 16 x 16 trellis tiles). Fused projections are refused by name (a tensor mesh loads the
separate ones).

Hybrid targets split by the same rules: gated attention by heads (q_proj's per-head gate comes
with its head), Gated DeltaNet by linear-attention key heads (its in-projections are grouped by
key head, so a column split gives each device whole key heads with their value heads; A_log and
dt_bias follow the value heads, out_proj is row-parallel; the conv kernel and the per-dim norm are
small and replicated), the routed experts by their FFN width (`PARAMS`), the shared expert as a
dense MLP, the router and the shared expert's gate replicated. The recurrent states follow the
value heads and the conv windows the key heads' channels (`cache_shardings`).
"""

import dataclasses
import math

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("data", "tensor")

# leaf module name -> (logical axis of the kernel's [in, out] dims)
LOGICAL = {
  "q_proj": (None, "heads"),
  "k_proj": (None, "kv_heads"),
  "v_proj": (None, "kv_heads"),
  "o_proj": ("heads", None),
  "gate_proj": (None, "mlp"),
  "up_proj": (None, "mlp"),
  "down_proj": ("mlp", None),
  "lm_head": (None, "vocab"),
  # Gated DeltaNet: [q, k, v, z] and [b, a] of each key head are adjacent columns
  # (checkpoint.hybrid_names.fuse_split_gdn), so contiguous shards hold whole key heads.
  "in_proj_qkvz": (None, "linear_heads"),
  "in_proj_ba": (None, "linear_heads"),
  "out_proj": ("linear_heads", None),
}
# (module, param) -> logical axes of a param that is not a Linear's kernel (others replicated).
# Routed experts split by their FFN width F, not by expert: XLA's partitioner turns a gather or
# ragged_dot over a sharded expert axis into masked gathers reduced at weight size (or gathers
# the experts whole), where a split of F needs only the [M, D] reduction after down_proj that a
# dense MLP has; and at decode every device reads 1/tensor of each routed expert, instead of the
# few devices that hold a token's e experts reading all of them.
PARAMS = {
  ("linear_attn", "A_log"): ("linear_heads",),
  ("linear_attn", "dt_bias"): ("linear_heads",),
  ("experts", "gate_proj"): (None, None, "expert_mlp"),  # [I, D, F]
  ("experts", "up_proj"): (None, None, "expert_mlp"),
  ("experts", "down_proj"): (None, "expert_mlp", None),  # [I, F, D]
}
RULES = {
  "heads": "tensor",
  "kv_heads": "tensor",
  "mlp": "tensor",
  "vocab": "tensor",
  "linear_heads": "tensor",
  "expert_mlp": "tensor",
}
KV_HEADS = P(None, None, "tensor")  # a [B, S, K, H] KV cache, as the k/v projections split it
CONV_CHANNELS = P(None, None, "tensor")  # a [B, w, X] conv window, channels grouped by key head
REC_HEADS = P(None, "tensor")  # a [B, Y, H, U] recurrent state, by value heads


class ShardingError(ValueError):
  """A mesh that the model's shapes cannot be split over."""


def make_mesh(tensor: int = 1, data: int = 1, devices=None) -> jax.sharding.Mesh:
  """A (data, tensor) mesh over the first data x tensor devices, both axes Auto (the partitioner
  propagates shardings from the weights)."""
  devices = list(devices if devices is not None else jax.devices())
  if tensor < 1 or data < 1 or tensor * data > len(devices):
    raise ShardingError(
      f"mesh data={data} x tensor={tensor} needs {data * tensor} devices; {len(devices)} present"
    )
  auto = (AxisType.Auto, AxisType.Auto)
  return jax.make_mesh((data, tensor), AXES, auto, devices=devices[: data * tensor])


def check_divides(config, tensor: int) -> None:
  """ShardingError naming each size the model splits by (config key and value) that `tensor` does
  not divide: heads, kv heads, MLP width and vocabulary, and for a hybrid target those of the
  layers it has (linear-attention key and value heads, the experts' and shared expert's width)."""
  types = getattr(config, "layer_types", ()) or ("full_attention",)
  moe = getattr(config, "moe_layers", ()) or (False,) * len(types)
  sizes = {}
  if "full_attention" in types:
    sizes |= {"num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads}
  if "linear_attention" in types:
    sizes["linear_num_key_heads"] = config.linear_num_key_heads
    sizes["linear_num_value_heads"] = config.linear_num_value_heads
  if not all(moe):
    sizes["intermediate_size"] = config.intermediate_size
  if any(moe):
    sizes["moe_intermediate_size"] = config.moe_intermediate_size
    if config.shared_expert_intermediate_size:
      sizes["shared_expert_intermediate_size"] = config.shared_expert_intermediate_size
  sizes["vocab_size"] = config.vocab_size
  bad = {k: v for k, v in sizes.items() if v % tensor}
  if bad:
    raise ShardingError(f"tensor={tensor} does not divide {bad} of the model")


def split_of(module: str | None) -> str | None:
  """How the kernel of the Linear named `module` splits over "tensor": "columns" (its output
  features), "rows" (its input features) or None (replicated)."""
  axes = LOGICAL.get(module)
  if axes is None:
    return None
  return "rows" if axes[0] else "columns"


def spec_of(path: tuple[str, ...], leaf) -> P:
  """The partition spec of one dense param by the module that owns it (replicated if none
  matches)."""
  if len(path) >= 2 and path[-2] in LOGICAL:
    axes = LOGICAL[path[-2]]
    if path[-1] == "kernel":
      return P(*(RULES.get(a) if a else None for a in axes))
    if path[-1] == "bias":  # follows the kernel's output features
      return P(RULES.get(axes[1]) if axes[1] else None)
  axes = PARAMS.get(tuple(path[-2:]))
  if axes is not None:
    return P(*(RULES.get(a) if a else None for a in axes))
  return P()


def quantized_specs(w, split: str | None, tensor: int, where: str):
  """`w` with each array field replaced by its partition spec when `w` splits by `split` over
  `tensor` devices (NVFP4 / FP8 fields are [N, ...] by output feature n, EXL3's trellis
  [K/16, N/16, ...], suh by input and svh and bias by output feature). ShardingError, naming
  `where`, the weight's shape and the degree, for a split that would cut NVFP4's scale groups or
  EXL3's Hadamard blocks."""
  from specdec.quant import exl3, fp8, nvfp4

  if tensor == 1 or split is None:
    return jax.tree.map(lambda _: P(), w)
  K = w.shape[0]
  by_n, by_k = P("tensor", None), P(None, "tensor")
  if isinstance(w, nvfp4.NVFP4Weight):
    if split == "rows" and (K % tensor or (K // tensor) % nvfp4.GROUP):
      raise ShardingError(
        f"{where}: K={K} over tensor={tensor} gives {K / tensor:g}-wide shards, which split "
        f"NVFP4's {nvfp4.GROUP}-wide scale groups"
      )
    if split == "columns":
      return dataclasses.replace(w, packed_NP=by_n, scales_NG=by_n, global_scale_N=P("tensor"))
    return dataclasses.replace(w, packed_NP=by_k, scales_NG=by_k, global_scale_N=P())
  if isinstance(w, fp8.FP8Weight):
    if split == "columns":
      return dataclasses.replace(w, codes_NK=by_n, scale_N=P("tensor"))
    return dataclasses.replace(w, codes_NK=by_k, scale_N=P())
  if isinstance(w, exl3.EXL3Weight):
    check_exl3_split(w, split, tensor, where)
    on = lambda spec: None if w.bias is None else spec  # noqa: E731
    if split == "columns":
      return dataclasses.replace(
        w, trellis=P(None, "tensor", None), suh=P(), svh=P("tensor"), bias=on(P("tensor"))
      )
    return dataclasses.replace(
      w, trellis=P("tensor", None, None), suh=P("tensor"), svh=P(), bias=on(P())
    )
  raise ShardingError(
    f"{where}: {type(w).__name__} weights cannot be split over tensor={tensor}; load the bf16 "
    "model or an NVFP4 / FP8 / EXL3 one"
  )


def check_exl3_split(w, split: str, tensor: int, where: str) -> None:
  """ShardingError unless every shard of the EXL3 weight `w` along `split` holds whole 128-point
  Hadamard blocks of its unpadded features: the rotation mixes a block's 128 features, so a shard
  that cuts one (or holds the padding past the last feature) cannot rotate locally."""
  from specdec.quant.exl3.hadamard import HAD_DIM

  axis, n = ("in", w.in_features) if split == "rows" else ("out", w.out_features)
  if n % (HAD_DIM * tensor):
    raise ShardingError(
      f"{where}: EXL3 weight (in, out) = {w.shape}, {split} split over tensor={tensor}: "
      f"{axis}_features={n} gives {n / tensor:g}-wide shards; each must be a multiple of EXL3's "
      f"{HAD_DIM}-point Hadamard block ({axis}_features a multiple of {HAD_DIM * tensor})"
    )


def param_specs(params, config, tensor: int):
  """The partition spec of every param over a mesh with `tensor` devices on its tensor axis: a
  tree like `params` (a quantized weight's fields each get theirs). ShardingError for shapes that
  do not split; nothing is placed or compiled."""
  check_divides(config, tensor)

  def spec(path, leaf):
    names = tuple(getattr(p, "key", getattr(p, "name", str(p))) for p in path)
    if any(n in ("qkv_proj", "gate_up_proj") for n in names) and tensor > 1:
      raise ShardingError(f"{'/'.join(names)}: fused projections cannot be split; load unfused")
    if isinstance(leaf, jax.Array | np.ndarray):
      return spec_of(names, leaf)
    module = names[-2] if len(names) >= 2 else None
    return quantized_specs(leaf, split_of(module), tensor, "/".join(names))

  is_leaf = lambda x: not isinstance(x, dict)  # noqa: E731 (quantized weights are one leaf each)
  return jax.tree_util.tree_map_with_path(spec, params, is_leaf=is_leaf)


def shardings_of(specs, mesh: jax.sharding.Mesh):
  """`NamedSharding`s on `mesh` for a tree of partition specs."""
  is_spec = lambda x: isinstance(x, P)  # noqa: E731
  return jax.tree.map(lambda sp: NamedSharding(mesh, sp), specs, is_leaf=is_spec)


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Whole on every device of `mesh`."""
  return NamedSharding(mesh, P())


def cache_shardings(cache, mesh: jax.sharding.Mesh):
  """Where a target's cache lives under `mesh`: KV caches by kv heads (as the k/v projections
  split them); a hybrid cache's conv windows by channel and recurrent states by value heads (as
  the Gated DeltaNet projections split them)."""
  on = lambda spec: lambda _: NamedSharding(mesh, spec)  # noqa: E731
  if not hasattr(cache, "rec"):
    return jax.tree.map(on(KV_HEADS), cache)
  return cache.replace(
    kv=jax.tree.map(on(KV_HEADS), cache.kv),
    conv=jax.tree.map(on(CONV_CHANNELS), cache.conv),
    rec=jax.tree.map(on(REC_HEADS), cache.rec),
  )


def decode_state_shardings(st, mesh: jax.sharding.Mesh):
  """Where a decode state lives under `mesh`: the target's cache by `cache_shardings`, every
  other field replicated. `generate` puts its prefilled state there and `lower_ahead` lowers the
  decode chunk for it, so the two share one executable (and step_costs measures that chunk)."""
  whole = replicated(mesh)
  return jax.tree.map(lambda _: whole, st).replace(cache=cache_shardings(st.cache, mesh))


def bytes_per_device(tree) -> int:
  """The bytes of a pytree on its fullest device: a placed array counts the shards each device
  holds, anything else (host arrays, quantized leaves' parts) counts whole on every device."""
  per, whole = {}, 0
  for x in jax.tree.leaves(tree):
    shards = getattr(x, "addressable_shards", None)
    if not shards:
      whole += x.size * x.dtype.itemsize
      continue
    for shard in shards:
      per[shard.device] = per.get(shard.device, 0) + shard.data.nbytes
  return max(per.values(), default=0) + whole


def mesh_of(tree) -> jax.sharding.Mesh | None:
  """The mesh the pytree's arrays are placed on by name (None: none)."""
  for x in jax.tree.leaves(tree):
    s = getattr(x, "sharding", None)
    if isinstance(s, NamedSharding):
      return s.mesh
  return None


def tensor_size(tree) -> int:
  """The tensor axis of the mesh the pytree's arrays are placed on (1: none)."""
  mesh = mesh_of(tree)
  return mesh.shape.get("tensor", 1) if mesh is not None else 1


def shard_bytes(tree, shardings) -> int:
  """The bytes one device holds of a pytree of arrays or ShapeDtypeStructs placed by `shardings`
  (a like tree of `NamedSharding`s): each leaf's shard shape, as the sharding cuts it."""
  leaves = jax.tree.leaves(tree)
  placed = jax.tree.leaves(shardings)
  return sum(
    math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
    for x, s in zip(leaves, placed, strict=True)
  )


def on_mesh(model, mesh: jax.sharding.Mesh):
  """`model` with its params on `mesh` by `param_specs` (itself when every param already is
  placed so: a target quantized after it was placed is placed again)."""
  specs = param_specs(model.params, model.config, mesh.shape["tensor"])
  want = jax.tree.leaves(shardings_of(specs, mesh))
  have = [getattr(x, "sharding", None) for x in jax.tree.leaves(model.params)]
  if all(isinstance(h, NamedSharding) and h == w for h, w in zip(have, want, strict=True)):
    return model
  return dataclasses.replace(model, params=jax.device_put(model.params, shardings_of(specs, mesh)))
