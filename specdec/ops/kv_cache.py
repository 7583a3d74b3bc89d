"""KV-cache storage: the dtypes a cache may hold, and the casts into and out of it.

An FP8 cache (float8_e4m3fn) stores clip(x / scale, +-448); attention reads f32(code) * scale in
the compute dtype, with one k and one v scale per layer. Caches of any other dtype ignore scales.
"""

import jax.numpy as jnp

FP8 = jnp.dtype(jnp.float8_e4m3fn)
FP8_MAX = 448.0
CACHE_DTYPES = tuple(jnp.dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float16, FP8))
KV_SCALES = ("k_scale", "v_scale")  # attention param names


def check_kv_dtype(dtype) -> jnp.dtype:
  """The dtype of a KV cache, refused unless the cache knows how to write and read it."""
  try:
    d = jnp.dtype(dtype)
  except TypeError as e:
    raise ValueError(f"KV cache dtype {dtype!r} is not a dtype") from e
  if d not in CACHE_DTYPES:
    # Other 8-bit floats would be cast without a scale or saturation: silently wrong numbers.
    raise ValueError(
      f"KV cache dtype {d.name} is not supported; choose from {[k.name for k in CACHE_DTYPES]}"
    )
  return d


def to_cache(x, dtype, scale=1.0):
  """K or V -> the cache's dtype; FP8 divides by the layer's scale and clips first because JAX's
  cast to e4m3 does not saturate (an out-of-range value would become NaN)."""
  if dtype != FP8:
    return x.astype(dtype)
  return jnp.clip(x.astype(jnp.float32) / scale, -FP8_MAX, FP8_MAX).astype(FP8)


def from_cache(cache_BSKH, scale, dtype):
  """What attention reads: FP8 codes times the layer's scale in `dtype`; other caches as stored."""
  if cache_BSKH.dtype != FP8:
    return cache_BSKH
  return (cache_BSKH.astype(jnp.float32) * scale).astype(dtype)


def write_cache(cache_BSKH, new_BTKH, positions_BT, scale=1.0):
  """Scatter this forward's K or V into the slots named by positions (one slot per position)."""
  b_BT = jnp.broadcast_to(jnp.arange(new_BTKH.shape[0])[:, None], positions_BT.shape)
  new_BTKH = to_cache(new_BTKH, cache_BSKH.dtype, scale)
  return cache_BSKH.at[b_BT, positions_BT].set(new_BTKH, mode="drop")


def move_slots(cache_BSKH, src_BT, dst_BT):
  """Copies the entries at slots src_BT to slots dst_BT (all read before any is written); a
  destination >= S is dropped. A tree step moves its accepted nodes to their sequence slots."""
  b_BT = jnp.broadcast_to(jnp.arange(cache_BSKH.shape[0])[:, None], src_BT.shape)
  return cache_BSKH.at[b_BT, dst_BT].set(cache_BSKH[b_BT, src_BT], mode="drop")
