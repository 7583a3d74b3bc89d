"""Sizing the decode state from free device memory, as serving engines do (vLLM's
gpu_memory_utilization): a batch and context that cannot fit fail before anything compiles, with
the numbers.

The state `prefill` builds is affine in the cache slots S: per slot, every sequence holds the
target's K and V of every layer, its token id and any drafter cache (draft LM, MTP/EAGLE heads,
block context); the rest (counters, a drafter's fixed state) does not grow with S. Both parts are
read off the state's shapes with `jax.eval_shape` (a trace, no compile) at two cache sizes, so every
drafter and cache layout is counted as it is, not as a formula believes it to be. For a target
placed on a tensor mesh both count what one device holds: each array of the state as generate()
shards it (the target's KV cache by kv heads, a hybrid target's recurrent and conv states by value
heads and channels), the params as placed.

The budget is `fraction` of the allocator's limit (JAX's `bytes_limit`: what XLA may use on the
device) minus what is already resident (params, drafters). 1 - fraction is the headroom left for
activations and XLA's workspace, which the plan does not model.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specdec import sharding
from specdec.decoding.step import StepConfig, prefill
from specdec.ops.sampling import Sampling

DEFAULT_FRACTION = 0.9
GiB = 1 << 30
PROBE_SLOTS = 64  # the second probe's extra slots: generate's cache granularity


class MemoryPlanError(ValueError):
  """The requested batch and context do not fit the device's memory budget."""


class DeviceMemory(NamedTuple):
  limit_bytes: int  # what the allocator may hand out (memory_stats' bytes_limit)
  in_use_bytes: int  # already allocated: params, drafters, live arrays


def kv_slot_bytes(config, kv_dtype) -> int:
  """Bytes of one target cache slot of one sequence: K and V of every layer, [K, H] each."""
  L, K, H = config.num_layers, config.num_kv_heads, config.head_dim
  return 2 * L * K * H * jnp.dtype(kv_dtype).itemsize


def tree_bytes(tree) -> int:
  """Bytes of a pytree of arrays or ShapeDtypeStructs (quantized weights and PRNG keys too)."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def device_memory() -> DeviceMemory | None:
  """The default device's limit and use; None where the backend keeps no stats (the CPU)."""
  stats = jax.local_devices()[0].memory_stats()
  if not stats or "bytes_limit" not in stats:
    return None
  return DeviceMemory(int(stats["bytes_limit"]), int(stats.get("bytes_in_use", 0)))


def check_fraction(fraction: float) -> None:
  if not 0 < fraction <= 1:
    raise ValueError(f"memory_fraction must be in (0, 1], got {fraction}")


def plan_slots(
  need_slots: int,
  batch: int,
  slot_bytes: int,
  memory: DeviceMemory,
  *,
  params_bytes: int = 0,
  other_bytes: int = 0,
  fraction: float = DEFAULT_FRACTION,
  kv_bytes: int | None = None,
  extra_bytes: int = 0,
) -> int:
  """The most cache slots `batch` sequences can have; MemoryPlanError if `need_slots` do not fit.

  slot_bytes: state bytes per slot per sequence; other_bytes: state that does not grow with slots;
  kv_bytes: the target KV's share of slot_bytes, named in the error. Resident is the larger of the
  bytes in use and the params, so a plan made before the params are placed still counts them,
  plus extra_bytes: params still to be built beside them (a sweep's fused projections).
  """
  check_fraction(fraction)
  if batch < 1 or slot_bytes < 1 or need_slots < 1:
    raise ValueError(f"batch={batch}, slot_bytes={slot_bytes}, need_slots={need_slots}: need >= 1")
  budget = fraction * memory.limit_bytes
  resident = max(memory.in_use_bytes, params_bytes) + extra_bytes
  available = budget - resident
  max_slots = max(int((available - other_bytes) // (batch * slot_bytes)), 0)
  if need_slots > max_slots:
    need = batch * need_slots * slot_bytes + other_bytes
    kv = f" (target KV {kv_bytes:,})" if kv_bytes is not None else ""
    extra = f" + {extra_bytes / GiB:.3f} GiB still to be built" if extra_bytes else ""
    raise MemoryPlanError(
      f"the decode state does not fit the device: B={batch} x {need_slots} slots x "
      f"{slot_bytes:,} bytes per slot{kv} + {other_bytes / GiB:.3f} GiB other state = "
      f"{need / GiB:.3f} GiB needed, {available / GiB:.3f} GiB available (fraction {fraction} "
      f"x {memory.limit_bytes / GiB:.3f} GiB limit - {resident / GiB:.3f} GiB resident, params "
      f"{params_bytes / GiB:.3f} GiB{extra}); at most {max_slots} slots fit at B={batch}: lower "
      "the batch, prompt, max_new_tokens or k, or raise memory_fraction"
    )
  return max_slots


def state_cost(model, drafter, k: int, batch: int, bucket: int, slots: int, kv_dtype=None):
  """(bytes per slot per sequence, bytes that do not grow with slots) of the decode state that
  generate() builds with this cache dtype (None: the model's dtype), on one device: for a target
  placed on a tensor mesh, each array counts the shard generate() leaves on a device
  (`sharding.decode_state_shardings`: the KV cache by kv heads, a hybrid target's conv windows by
  channel and recurrent states by value heads, the rest whole).

  Sampling, mode and EOS ids do not change the state's shapes; fixing them lets every call with
  the same shapes share the two probe traces.
  """
  mesh = sharding.mesh_of(model.params)
  sc = StepConfig(model.config, model.dtype, drafter, k, Sampling(), "greedy", (), kv_dtype)
  i32 = jnp.int32
  args = (
    jax.ShapeDtypeStruct((batch, bucket), i32),
    jax.ShapeDtypeStruct((batch,), i32),
    jax.ShapeDtypeStruct((batch,), i32),
    jax.eval_shape(jax.random.key, 0),
  )

  def size(s: int) -> int:
    fn = functools.partial(prefill, sc=sc, slots=s)
    st = jax.eval_shape(fn, model.params, drafter.params, *args)
    if mesh is None:
      return tree_bytes(st)
    return sharding.shard_bytes(st, sharding.decode_state_shardings(st, mesh))

  at_s, grown = size(slots), size(slots + PROBE_SLOTS)
  slot_bytes = -(-(grown - at_s) // (PROBE_SLOTS * batch))
  return slot_bytes, max(at_s - batch * slots * slot_bytes, 0)


def check_fits(
  model,
  drafter,
  k: int,
  batch: int,
  bucket: int,
  slots: int,
  kv_dtype=None,
  fraction: float | None = DEFAULT_FRACTION,
  memory: DeviceMemory | None = None,
  extra_bytes: int = 0,
) -> int | None:
  """generate()'s plan: the most slots that fit, or None where nothing is planned (fraction None,
  or no memory stats and no explicit `memory` budget). Raises MemoryPlanError when `slots` do not
  fit; runs before anything compiles. kv_dtype as generate() takes it (None: the model's);
  extra_bytes as plan_slots takes it."""
  if fraction is None:
    return None
  check_fraction(fraction)
  if memory is None:
    memory = device_memory()
  if memory is None:
    return None
  kv_dtype = model.kv_dtype if kv_dtype is None else kv_dtype  # as generate() resolves it
  # Per device: a tensor mesh splits the params and the target's cache (state_cost); the token
  # buffer and a drafter's params and state stay whole.
  slot_bytes, other_bytes = state_cost(model, drafter, k, batch, bucket, slots, kv_dtype)
  kv = kv_slot_bytes(model.config, model.dtype if kv_dtype is None else kv_dtype)
  return plan_slots(
    slots,
    batch,
    slot_bytes,
    memory,
    params_bytes=sharding.bytes_per_device(model.params) + tree_bytes(drafter.params),
    other_bytes=other_bytes,
    fraction=fraction,
    kv_bytes=-(-kv // sharding.tensor_size(model.params)),
    extra_bytes=extra_bytes,
  )
