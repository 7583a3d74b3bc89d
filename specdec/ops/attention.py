"""Attention over the static KV cache, with its one dispatch point: the Pallas decode kernel or XLA.

Shapes: B batch, T queries, S cache slots, N query heads, K kv heads, G = N / K, H head dim,
n nodes of a draft tree.
"""

import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from kernels_pallas import decode_attention
from specdec.ops.kv_cache import FP8, from_cache

ATTENTION_PATHS = ("auto", "xla")  # what `attention_path` returns


class TreeMask(NamedTuple):
  """A forward over nodes of a draft tree (specdec/decoding/tree.py): node i's K/V lives at slot
  root_B + i, and a query reads the committed slots before the root plus the node slots sees_Tn
  marks (its ancestors and itself). RoPE positions stay the forward's `positions` (root + depth)."""

  root_B: jax.Array  # [B] slot of the root, the newest committed token
  nodes_T: np.ndarray  # [T] int: the tree node each query is
  sees_Tn: np.ndarray  # [T, n] bool

  @property
  def slots_BT(self):
    return self.root_B[:, None] + jnp.asarray(self.nodes_T, jnp.int32)[None, :]


def attention_path() -> str:
  """The attention path result rows record: "xla" when SPECDEC_ATTENTION=xla forces `attend_xla`,
  else "auto" (the kernel where `attend` can use it)."""
  return "xla" if os.environ.get("SPECDEC_ATTENTION", "") == "xla" else "auto"


def attend(
  q_BTNH, k_BSKH, v_BSKH, positions_BT, k_scale=1.0, v_scale=1.0, tree=None, from_zero=False
):
  """Each query t of row b over the cache slots <= positions[b, t] (or, with a `TreeMask`, the
  slots it marks), caches as stored (an FP8 cache's codes read as code x scale, `from_cache`):
  kernels_pallas's decode attention on a GPU where it applies (a few queries per kv head; measured
  faster in docs/benchmarks.md; FP8 codes read as they are where SMEM allows, else widened
  first), else `attend_xla`. SPECDEC_ATTENTION=xla forces XLA (read when traced).

  from_zero: the caller promises positions 0..T-1 in every row over a cache of S = T slots (a
  full-sequence forward, as every trainer runs): on a GPU, cuDNN's fused causal attention, which
  never holds the [T, S] scores in memory."""
  if from_zero and tree is None and _flash_ok(q_BTNH, k_BSKH):
    k_BSKH = from_cache(k_BSKH, k_scale, q_BTNH.dtype)
    v_BSKH = from_cache(v_BSKH, v_scale, q_BTNH.dtype)
    return jax.nn.dot_product_attention(
      q_BTNH, k_BSKH, v_BSKH, is_causal=True, implementation="cudnn"
    )
  # A tree forward too: the kernel reads the prefix before the root, its node window is in jnp.
  da = _attention_kernels()
  if da is not None and da.supported(q_BTNH, k_BSKH, v_BSKH):  # the caches as stored
    kernel = with_xla_gradient(by_heads(da.decode_attention))
    return kernel(q_BTNH, k_BSKH, v_BSKH, positions_BT, k_scale, v_scale, tree=tree)
  k_BSKH = from_cache(k_BSKH, k_scale, q_BTNH.dtype)
  v_BSKH = from_cache(v_BSKH, v_scale, q_BTNH.dtype)
  if da is not None and da.supported(q_BTNH, k_BSKH, v_BSKH):  # FP8 codes over SMEM, widened
    kernel = with_xla_gradient(by_heads(da.decode_attention))
    return kernel(q_BTNH, k_BSKH, v_BSKH, positions_BT, tree=tree)
  return attend_xla(q_BTNH, k_BSKH, v_BSKH, positions_BT, tree)


def with_xla_gradient(kernel):
  """`kernel(q, k, v, positions, [k_scale, v_scale], tree=None)` forward, `attend_xla`'s gradient
  (under the same tree mask) backward: a Pallas call has no differentiation rule, and the trainers
  differentiate through decode-shaped forwards (chained MTP / EAGLE-3 drafting). Caches of FP8
  codes, the scales and the tree get no gradient."""

  @jax.custom_vjp
  def attention(q_BTNH, k_BSKH, v_BSKH, positions_BT, tree, *scales):
    return kernel(q_BTNH, k_BSKH, v_BSKH, positions_BT, *scales, tree=tree)

  def forward(q_BTNH, k_BSKH, v_BSKH, positions_BT, tree, *scales):
    out = kernel(q_BTNH, k_BSKH, v_BSKH, positions_BT, *scales, tree=tree)
    return out, (q_BTNH, k_BSKH, v_BSKH, positions_BT, tree, scales)

  def backward(residuals, g_BTNH):
    q_BTNH, k_BSKH, v_BSKH, positions_BT, tree, scales = residuals
    k_scale, v_scale = scales or (1.0, 1.0)

    def reference(q, k, v):
      k, v = from_cache(k, k_scale, q.dtype), from_cache(v, v_scale, q.dtype)
      return attend_xla(q, k, v, positions_BT, tree)

    if k_BSKH.dtype == FP8:  # codes: only the queries get a gradient
      _, vjp = jax.vjp(lambda q: reference(q, k_BSKH, v_BSKH), q_BTNH)
      grads = (*vjp(g_BTNH), None, None)
    else:
      _, vjp = jax.vjp(reference, q_BTNH, k_BSKH, v_BSKH)
      grads = vjp(g_BTNH)
    return (*grads, None, None, *(None for _ in scales))

  attention.defvjp(forward, backward)

  def call(q_BTNH, k_BSKH, v_BSKH, positions_BT, *scales, tree=None):
    return attention(q_BTNH, k_BSKH, v_BSKH, positions_BT, tree, *scales)

  return call


def by_heads(kernel):
  """`kernel(q, k, v, positions, *scales, tree=None)` run per device over its own heads when the
  context mesh (`jax.set_mesh`) has a "tensor" axis > 1: a Pallas call is opaque to XLA's
  partitioner, and attention needs no reduction across heads (query head n reads kv head n // G,
  and a contiguous split of N heads over the axis gives each device whole groups; a tree is per
  batch row, replicated). Otherwise the kernel as is."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.shape.get("tensor", 1) == 1:
    return kernel
  heads = P(None, None, "tensor", None)

  def sharded(q_BTNH, k_BSKH, v_BSKH, positions_BT, *scales, tree=None):
    fn = jax.shard_map(
      lambda q, k, v, positions, tree, *scales: kernel(q, k, v, positions, *scales, tree=tree),
      mesh=mesh, in_specs=(heads, heads, heads, P(), P(), *(P(),) * len(scales)),
      out_specs=heads, check_vma=False,
    )  # fmt: skip
    return fn(q_BTNH, k_BSKH, v_BSKH, positions_BT, tree, *scales)

  return sharded


def _attention_kernels():
  """kernels_pallas.decode_attention on a GPU unless SPECDEC_ATTENTION=xla, else None."""
  if attention_path() != "auto" or jax.default_backend() != "gpu":
    return None
  return decode_attention


def _flash_ok(q_BTNH, k_BSKH) -> bool:
  """Whether `attend`'s from_zero path can use cuDNN: a GPU, not forced to XLA, half-precision
  queries, a head dim cuDNN's flash kernels take, as many slots as queries."""
  H = q_BTNH.shape[-1]
  return (
    _attention_kernels() is not None
    and q_BTNH.dtype in (jnp.bfloat16, jnp.float16) and H <= 128 and H % 8 == 0
    and q_BTNH.shape[1] == k_BSKH.shape[1]
  )  # fmt: skip


def visible(positions_BT, slots: int, tree: TreeMask | None = None):
  """[B, T, S] bool: the slots each query reads; causal by position, or a tree's mask."""
  slots_S = jnp.arange(slots)
  if tree is None:
    return slots_S[None, None, :] <= positions_BT[:, :, None]
  n = tree.sees_Tn.shape[1]
  off_BS = slots_S[None, :] - tree.root_B[:, None]  # node index where the slot holds a node
  sees_TBS = jnp.asarray(tree.sees_Tn)[:, jnp.clip(off_BS, 0, n - 1)]
  in_tree_BS = (off_BS >= 0) & (off_BS < n)
  return (off_BS < 0)[:, None, :] | (in_tree_BS[:, None, :] & jnp.moveaxis(sees_TBS, 0, 1))


def attend_xla(q_BTNH, k_BSKH, v_BSKH, positions_BT, tree: TreeMask | None = None):
  B, T, N, H = q_BTNH.shape
  K = k_BSKH.shape[2]
  q_BTKGH = q_BTNH.reshape(B, T, K, N // K, H)
  s_BTKGS = jnp.einsum("BTKGH,BSKH->BTKGS", q_BTKGH, k_BSKH, preferred_element_type=jnp.float32)
  s_BTKGS = s_BTKGS * (H**-0.5)
  visible_BTS = visible(positions_BT, k_BSKH.shape[1], tree)
  s_BTKGS = jnp.where(visible_BTS[:, :, None, None, :], s_BTKGS, -1e30)
  p_BTKGS = jax.nn.softmax(s_BTKGS, axis=-1).astype(v_BSKH.dtype)
  o_BTKGH = jnp.einsum("BTKGS,BSKH->BTKGH", p_BTKGS, v_BSKH, preferred_element_type=jnp.float32)
  return o_BTKGH.reshape(B, T, N, H).astype(q_BTNH.dtype)
