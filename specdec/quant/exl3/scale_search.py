"""Global scale search: how large the regularized weight should be relative to the codebook.

The trellis error as a function of the scale is flat near its optimum and not quite unimodal, so (as
exllamav3 does) we evaluate a coarse grid on a subsample of tiles, then a small fine grid around the
coarse minimum on all sampled tiles, refined by a parabola through the best three points.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec.quant.exl3.codebook import Codebook
from specdec.quant.exl3.layout import TENSOR_CORE_PERM, TILE_DIM
from specdec.quant.exl3.viterbi import viterbi_tiles


@dataclasses.dataclass(frozen=True)
class ScaleSearch:
  """Search settings; the defaults are exllamav3's (v1.4.1)."""

  coarse: tuple[float, ...] = tuple(0.1 + 0.2 * i for i in range(10))
  coarse_stride: int = 3  # the coarse grid sees every 3rd sampled tile
  fine_step: float = 0.075
  fine_points: int = 5
  diag_width: int = 3  # sampled tiles per tile row along a wrapped diagonal
  extreme_tiles: int = 8  # at least this many highest- and lowest-RMS tiles are added


@functools.partial(jax.jit, static_argnames=("search",))
def sample_tiles(w_IO: jax.Array, search: ScaleSearch) -> jax.Array:
  """Tiles [S, 256] (trellis order) from a wrapped diagonal plus the extreme-RMS tiles.

  The diagonal touches every tile row and column (outliers are usually whole channels); the
  extremes insure against outlier tiles the diagonal misses.
  """
  n_in, n_out = w_IO.shape
  tk, tn = n_in // TILE_DIM, n_out // TILE_DIM
  w_KrNc = w_IO.reshape(tk, TILE_DIM, tn, TILE_DIM)
  diag_len = max(tk, tn)
  along = np.repeat(np.arange(diag_len), search.diag_width)
  across = np.tile(np.arange(search.diag_width), diag_len)
  rows, cols = along % tk, (along + across) % tn
  n_extreme = min(max(search.extreme_tiles, along.size // 16), (tk * tn + 1) // 2)
  tile_ms_KN = jnp.mean(jnp.square(w_KrNc), axis=(1, 3)).reshape(-1)
  extreme = jnp.concatenate(
    [jax.lax.top_k(tile_ms_KN, n_extreme)[1], jax.lax.top_k(-tile_ms_KN, n_extreme)[1]]
  )
  rows = jnp.concatenate([jnp.asarray(rows), extreme // tn])
  cols = jnp.concatenate([jnp.asarray(cols), extreme % tn])
  rowmajor_SP = w_KrNc[rows, :, cols, :].reshape(-1, TILE_DIM * TILE_DIM)
  return rowmajor_SP[:, TENSOR_CORE_PERM]


def _mse_per_scale(tiles_SP, scales_G, bits, codebook, chunk):
  scaled_GSP = scales_G[:, None, None] * tiles_SP[None]
  _, values_NP = viterbi_tiles(scaled_GSP.reshape(-1, tiles_SP.shape[1]), bits, codebook, chunk)
  err_GSP = values_NP.reshape(scaled_GSP.shape) / scales_G[:, None, None] - tiles_SP[None]
  return jnp.mean(jnp.square(err_GSP), axis=(1, 2))


@functools.partial(jax.jit, static_argnames=("bits", "codebook", "search", "chunk"))
def search_scale(
  tiles_SP: jax.Array,
  bits: int,
  codebook: Codebook,
  search: ScaleSearch = ScaleSearch(),
  chunk: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Best multiplier g for the tiles -> (g, sample MSE at the best fine grid point)."""
  coarse_G = jnp.asarray(search.coarse, jnp.float32)
  mse_G = _mse_per_scale(tiles_SP[:: search.coarse_stride], coarse_G, bits, codebook, chunk)
  half = search.fine_points // 2
  offsets_F = search.fine_step * (jnp.arange(search.fine_points) - half)
  fine_F = coarse_G[jnp.argmin(mse_G)] + offsets_F
  mse_F = _mse_per_scale(tiles_SP, fine_F, bits, codebook, chunk)
  best = jnp.argmin(mse_F)
  # Vertex of the parabola through the best point and its neighbours, within half a step.
  y0, y1, y2 = (mse_F[jnp.clip(best + d, 0, search.fine_points - 1)] for d in (-1, 0, 1))
  curvature = y0 - 2.0 * y1 + y2
  interior = (best > 0) & (best < search.fine_points - 1) & (curvature > 0)
  shift = jnp.where(interior, 0.5 * (y0 - y2) / jnp.where(interior, curvature, 1.0), 0.0)
  g = fine_F[best] + jnp.clip(shift, -0.5, 0.5) * search.fine_step
  return jnp.maximum(g, 0.01), mse_F[best]
