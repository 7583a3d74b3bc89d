"""Tail-biting Viterbi search over the EXL3 trellis, vectorized over 16x16 tiles.

A tile is a sequence of 256 weights. Position t holds a 16-bit state s_t = ((s_{t-1} << K) | sym_t)
& 0xFFFF, so consecutive states share 16 - K bits (the "edge"), and the sequence is cyclic: s_0's
top 16 - K bits are s_255's low 16 - K bits. The search keeps one best cost per edge value
(2^(16-K) of them) and, per step, picks the best of the 2^K states that end in each edge.

Exact tail-biting search would cost 2^(16-K) full searches; like exllamav3 and QTIP we use two
passes: an unconstrained pass over the sequence rotated by 128 fixes the wrap-around edge, and a
second pass from position 0 is constrained to start and end on it.
"""

import functools

import jax
import jax.numpy as jnp

from specdec.quant.exl3.bitstream import TILE
from specdec.quant.exl3.codebook import Codebook, codebook_lut


def _step_fn(lut_kHL: jax.Array, bits: int):
  """One trellis step: costs over edges [T, E] + the weights at this position [T] -> new costs."""
  n_k = 1 << bits
  n_hi = 1 << (16 - 2 * bits)
  k_k11 = jnp.arange(n_k, dtype=jnp.int32)[:, None, None]
  tag_mask = n_k - 1

  def step(cost_TE, w_T):
    # State s = k << (16-K) | e_hi << K | e_lo ends in edge e = (e_hi, e_lo) and comes from edge
    # s >> K = (k, e_hi): a reshape, not a gather.
    cost_TkH1 = cost_TE.reshape(-1, n_k, n_hi, 1)
    diff_TkHL = lut_kHL - w_T[:, None, None, None]
    cand_TkHL = cost_TkH1 + diff_TkHL * diff_TkHL
    # Costs are >= 0, so their f32 bit patterns order like the floats. Writing k into the K lowest
    # mantissa bits makes one integer min give both the best cost and its argmin: XLA:CPU runs that
    # 2-10x faster than min + argmin. The perturbation is < 2^K ulp, far below any cost difference
    # that matters.
    tagged_TkHL = (jax.lax.bitcast_convert_type(cand_TkHL, jnp.int32) & ~tag_mask) | k_k11
    best_THL = jnp.min(tagged_TkHL, axis=1).reshape(cost_TE.shape)
    cost_TE = jax.lax.bitcast_convert_type(best_THL & ~tag_mask, jnp.float32)
    return cost_TE, (best_THL & tag_mask).astype(jnp.uint8)

  return step


def _backtrack(
  back_PTE: jax.Array, end_edge_T: jax.Array, bits: int
) -> tuple[jax.Array, jax.Array]:
  """Follow back-pointers from the last position -> (states [T, P] int32, edge before t = 0)."""
  shift = 16 - bits

  def step(edge_T, back_TE):
    k_T = jnp.take_along_axis(back_TE, edge_T[:, None], axis=1)[:, 0].astype(jnp.int32)
    state_T = (k_T << shift) | edge_T
    return state_T >> bits, state_T

  first_edge_T, states_PT = jax.lax.scan(step, end_edge_T, back_PTE, reverse=True)
  return states_PT.T, first_edge_T


def _viterbi(w_TP: jax.Array, bits: int, codebook: Codebook) -> tuple[jax.Array, jax.Array]:
  n_edges = 1 << (16 - bits)
  lut = codebook_lut(codebook).astype(jnp.float32)
  step = _step_fn(lut.reshape(1 << bits, 1 << (16 - 2 * bits), 1 << bits), bits)
  w_PT = w_TP.astype(jnp.float32).T
  n_tiles = w_TP.shape[0]
  half = TILE // 2

  # Pass 1, rotated by 128: free start; only the back-pointers of positions 0..127 are kept.
  zero_TE = jnp.zeros((n_tiles, n_edges), jnp.float32)
  cost_TE, _ = jax.lax.scan(lambda c, w: (step(c, w)[0], None), zero_TE, w_PT[half:])
  cost_TE, back_PTE = jax.lax.scan(step, cost_TE, w_PT[:half])
  _, wrap_edge_T = _backtrack(back_PTE, jnp.argmin(cost_TE, axis=1).astype(jnp.int32), bits)

  # Pass 2: start from the wrap edge and force the sequence to end on it.
  edges_E = jnp.arange(n_edges, dtype=jnp.int32)
  start_TE = jnp.where(edges_E[None, :] == wrap_edge_T[:, None], 0.0, jnp.inf)
  _, back_PTE = jax.lax.scan(step, start_TE, w_PT)
  states_TP, _ = _backtrack(back_PTE, wrap_edge_T, bits)
  return states_TP, lut[states_TP]


def default_chunk(bits: int) -> int:
  """Tiles per Viterbi batch: keeps the back-pointers (256 x 2^(16-K) bytes a tile) near 256 MiB."""
  return 1 << (4 + bits)


@functools.partial(jax.jit, static_argnames=("bits", "codebook", "chunk"))
def viterbi_tiles(
  w_NP: jax.Array, bits: int, codebook: Codebook | str, chunk: int | None = None
) -> tuple[jax.Array, jax.Array]:
  """Best tail-biting state sequence for each tile (jit-able; batches of `chunk` tiles).

  w_NP: [tiles, 256] targets in trellis order, already scaled to the codebook.
  Returns (states [tiles, 256] int32, codebook values [tiles, 256] float32).
  """
  assert 1 <= bits <= 8 and w_NP.ndim == 2 and w_NP.shape[1] == TILE
  codebook = Codebook(codebook)
  n_tiles = w_NP.shape[0]
  chunk = min(chunk or default_chunk(bits), n_tiles)
  n_chunks = -(-n_tiles // chunk)
  if n_chunks == 1:
    return _viterbi(w_NP, bits, codebook)
  w_CTP = jnp.pad(w_NP, ((0, n_chunks * chunk - n_tiles), (0, 0))).reshape(n_chunks, chunk, TILE)
  states_CTP, values_CTP = jax.lax.map(lambda w: _viterbi(w, bits, codebook), w_CTP)
  return states_CTP.reshape(-1, TILE)[:n_tiles], values_CTP.reshape(-1, TILE)[:n_tiles]
