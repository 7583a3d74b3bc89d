"""The attention part's cell: attention over the cache for w queries per row, one layer-call, in
each implementation the benchmark compares (ATTENTION_IMPLS, see `attention_op`), with its error
against float32 `attend` on the same inputs.
"""

import functools
import statistics

import jax
import jax.numpy as jnp

from specdec.bench import timing
from specdec.bench.decode_cells import compile_aot, spread
from specdec.bench.random_models import fill, synthetic_state
from specdec.models.config import ModelConfig
from specdec.models.transformer import KVCache
from specdec.ops.attention import attend, attend_xla

ATTENTION_IMPLS = ("xla", "pallas", "xla_sdpa", "cudnn", "cudnn_seqlen")


def attention_op(impl: str):
  """(q_BTNH, k_BSKH, v_BSKH, positions_BT) -> o_BTNH, query t seeing slots <= positions[:, t].

  xla: the einsum `attend_xla`. pallas: kernels_pallas.decode_attention (what `attend` runs on a
  GPU). xla_sdpa / cudnn: jax.nn.dot_product_attention with that visibility as a boolean mask
  (which JAX turns into an additive bias [B, 1, T, S]). cudnn_seqlen:
  cuDNN's padding mask (key_value_seq_lengths) and no bias: every query of a row sees the slots up
  to the row's LAST position, exact for T = 1 only (its causal masks are top-left aligned, not the
  bottom-right alignment a verify block needs), timed to show what the bias costs.
  """
  if impl == "xla":
    return attend_xla
  if impl == "pallas":
    from kernels_pallas.decode_attention import decode_attention

    return decode_attention

  def sdpa(q_BTNH, k_BSKH, v_BSKH, positions_BT):
    if impl == "cudnn_seqlen":
      return jax.nn.dot_product_attention(
        q_BTNH, k_BSKH, v_BSKH, key_value_seq_lengths=positions_BT[:, -1] + 1,
        implementation="cudnn",
      )  # fmt: skip
    visible_BTS = jnp.arange(k_BSKH.shape[1])[None, None, :] <= positions_BT[:, :, None]
    implementation = "cudnn" if impl == "cudnn" else "xla"
    return jax.nn.dot_product_attention(
      q_BTNH, k_BSKH, v_BSKH, mask=visible_BTS[:, None], implementation=implementation
    )

  return sdpa


@functools.partial(jax.jit, static_argnames=("impl", "n"))
def _attention_loop(q_BTNH, cache: KVCache, positions_BT, impl: str, n: int):
  op = attention_op(impl)

  def body(i, q_BTNH):
    # One call per layer on that layer's cache, as in the model, so K/V stream from HBM: looping
    # over one layer's cache would time the 50 MB L2. Each output is the next query, so nothing
    # is loop-invariant and nothing can be hoisted.
    for k_BSKH, v_BSKH in zip(cache.k, cache.v, strict=True):
      q_BTNH = op(q_BTNH, k_BSKH, v_BSKH, positions_BT)
    return q_BTNH

  return jax.lax.fori_loop(0, n, body, q_BTNH)


def attention_cell(
  config: ModelConfig, batch: int, slots: int, width: int, impl: str, n: int, reps: int
) -> dict:
  """Seconds per layer-call of attention for `width` queries per row over an S = slots cache,
  and its error against float32 `attend` on the same inputs."""
  cache = synthetic_state(config, batch, slots, slots - width + 1, 0, jnp.dtype(jnp.bfloat16)).cache
  shape_BTNH = (batch, width, config.num_heads, config.head_dim)
  q_BTNH = fill(shape_BTNH, jnp.bfloat16, 1, scale=1.0)
  positions_BT = jnp.broadcast_to(
    slots - width + jnp.arange(width, dtype=jnp.int32), (batch, width)
  )
  layer0 = (q_BTNH, cache.k[0], cache.v[0])
  o = jax.jit(attention_op(impl))(*layer0, positions_BT).astype(jnp.float32)
  ref = attend(*(a.astype(jnp.float32) for a in layer0), positions_BT)
  rel_err = float(jnp.linalg.norm(o - ref) / jnp.linalg.norm(ref))
  compiled, compile_s = compile_aot(_attention_loop, q_BTNH, cache, positions_BT, impl=impl, n=n)
  times = timing.timings(lambda: compiled(q_BTNH, cache, positions_BT), reps)
  per = [t / (n * config.num_layers) for t in times]
  kv_bytes = cache.k[0].nbytes + cache.v[0].nbytes
  return {
    **spread(per),
    "kv_bytes": kv_bytes,
    "tb_s": kv_bytes / statistics.median(per) / 1e12,
    "rel_err_vs_f32": rel_err,
    "layer_calls": n * config.num_layers,
    "compile_s": compile_s,
  }
