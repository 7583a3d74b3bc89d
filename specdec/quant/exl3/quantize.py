"""Quantize one dense (in, out) weight to an `EXL3Weight` (exllamav3's algorithm, in JAX).

1. Output side: random sign flips times per-column RMS (normalized to mean 1), then the 128-point
   Hadamard on the columns.
2. Input side: random sign flips times per-row RMS / -3INST_RMS, then the Hadamard on the rows.
   Every row then has the 3INST codebook's RMS (exllamav3 uses that for every codebook).
3. A global scale search; the scale is folded into suh.
4. Tail-biting Viterbi per 16x16 tile; with a calibration Hessian, LDLQ error feedback (ldlq.py).

Deviation from exllamav3, on purpose: LDLQ uses the Hessian rotated with the full suh (signs and
row scales: the exact proxy loss of the stored weight); exllamav3 rotates it with the signs only,
which loses most of LDLQ's gain when row scales vary (tests/quant/test_exl3_quantize.py).
Every kernel is jitted; this module is the thin host-side orchestration around them.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec.quant.exl3.bitstream import pack_states
from specdec.quant.exl3.codebook import INST3_RMS, Codebook
from specdec.quant.exl3.hadamard import HAD_DIM, had_cols, had_rows
from specdec.quant.exl3.layout import matrix_to_tiles, pad_to
from specdec.quant.exl3.ldlq import block_ldl, ldlq
from specdec.quant.exl3.scale_search import ScaleSearch, sample_tiles, search_scale
from specdec.quant.exl3.viterbi import viterbi_tiles
from specdec.quant.exl3.weight import EXL3Weight

DEFAULT_SEARCH = ScaleSearch()
_TINY = 1e-30
_MAX_DAMPING_RETRIES = 10


def _rms(x, axis):
  return jnp.sqrt(jnp.mean(jnp.square(x), axis=axis))


@functools.partial(jax.jit, static_argnames=("out_scales",))
def regularize(w_IO, su_sign_I, sv_sign_O, out_scales: bool):
  """Padded w (in, out) -> (w . diag(1/svh) . H, input-side scale su [in] f32, svh [out] f16).

  svh is rounded to f16 before it divides w, so the stored vector is the one quantized against.
  """
  col_rms_O = _rms(w_IO, axis=0)
  zero_col_O = col_rms_O < _TINY
  col_scale_O = col_rms_O / jnp.maximum(jnp.mean(col_rms_O), _TINY)
  if not out_scales:
    col_scale_O = jnp.ones_like(col_scale_O)
  svh_O = (sv_sign_O * jnp.where(zero_col_O, 1.0, col_scale_O)).astype(jnp.float16)
  w_IO = had_cols(w_IO / svh_O.astype(jnp.float32))
  svh_O = jnp.where(zero_col_O, jnp.float16(0), svh_O)  # an all-zero column stays exactly zero

  row_rms_I = _rms(w_IO, axis=1)
  row_rms_I = jnp.where(row_rms_I < _TINY, 1.0, row_rms_I)
  # The negative sign is exllamav3's; it makes no difference to the error.
  su_I = su_sign_I * row_rms_I / -INST3_RMS
  return w_IO, su_I, svh_O


@jax.jit
def _apply_su(w_IO, suh_I):
  return had_rows(w_IO / suh_I.astype(jnp.float32)[:, None])


@jax.jit
def _rotate_hessian(h_II, suh_I, damping):
  """Damped H in the quantized weight's basis: Hk diag(suh) (H + damping I) diag(suh) Hk."""
  h_II = h_II + damping * jnp.eye(h_II.shape[0], dtype=h_II.dtype)
  su_I = suh_I.astype(jnp.float32)
  return had_rows(had_cols(su_I[:, None] * h_II * su_I[None, :]))


def _ldl_of(h_II, suh_I, sigma_reg: float) -> jax.Array | None:
  """L of the rotated, damped Hessian; more damping while it is not positive definite."""
  diag_mean = float(jnp.mean(jnp.diag(h_II)))
  if not np.isfinite(diag_mean) or diag_mean < 1e-20:
    return None  # no usable calibration: plain rounding, as exllamav3 falls back
  damping = sigma_reg * diag_mean
  for _ in range(_MAX_DAMPING_RETRIES + 1):
    l_II = block_ldl(_rotate_hessian(h_II, suh_I, damping))
    if bool(jnp.all(jnp.isfinite(l_II))):
      return l_II
    damping += 2.0 * sigma_reg * diag_mean
  raise ValueError("Hessian is not positive definite even after damping")


def _pad_hessian(hessian, n_in, n_in_p):
  h_II = jnp.asarray(hessian, jnp.float32)
  if h_II.shape != (n_in, n_in):
    raise ValueError(f"hessian shape {h_II.shape} does not match in_features {n_in}")
  return jnp.pad(h_II, ((0, n_in_p - n_in), (0, n_in_p - n_in)))


def quantize_linear(
  w_IO,
  bits: int,
  *,
  key: jax.Array | int = 0,
  codebook: Codebook | str = Codebook.MUL1,
  hessian=None,
  bias=None,
  out_scales: bool = True,
  sigma_reg: float = 0.025,
  search: ScaleSearch | None = DEFAULT_SEARCH,
  chunk: int | None = None,
) -> EXL3Weight:
  """Dense w (in, out), i.e. HF's [out, in] transposed -> EXL3Weight with K = `bits` (1..8).

  hessian: optional E[x^T x] over calibration inputs, (in, in); enables LDLQ.
  search: global scale search settings; None keeps the scale at 1 (rows at the 3INST RMS).
  chunk: tiles per Viterbi batch (memory vs speed), see viterbi.default_chunk.
  """
  if not 1 <= bits <= 8:
    raise ValueError(f"bits must be in 1..8, got {bits}")
  codebook = Codebook(codebook)
  w_IO = jnp.asarray(w_IO, jnp.float32)
  n_in, n_out = w_IO.shape
  n_in_p, n_out_p = pad_to(n_in, HAD_DIM), pad_to(n_out, HAD_DIM)
  w_IO = jnp.pad(w_IO, ((0, n_in_p - n_in), (0, n_out_p - n_out)))
  h_II = None if hessian is None else _pad_hessian(hessian, n_in, n_in_p)
  key = jax.random.key(key) if isinstance(key, int) else key
  key_u, key_v = jax.random.split(key)
  su_sign_I = jax.random.rademacher(key_u, (n_in_p,), jnp.float32)
  sv_sign_O = jax.random.rademacher(key_v, (n_out_p,), jnp.float32)

  w_IO, su_I, svh_O = regularize(w_IO, su_sign_I, sv_sign_O, out_scales)
  if search is not None:
    tiles_SP = sample_tiles(_apply_su(w_IO, su_I), search)
    g, _ = search_scale(tiles_SP, bits, codebook, search, chunk)
    su_I = su_I / g
  suh_I = su_I.astype(jnp.float16)
  w_IO = _apply_su(w_IO, suh_I)

  l_II = None if h_II is None else _ldl_of(h_II, suh_I, sigma_reg)
  if l_II is None:
    states_NP, _ = viterbi_tiles(matrix_to_tiles(w_IO).reshape(-1, 256), bits, codebook, chunk)
    states_KNP = states_NP.reshape(n_in_p // 16, n_out_p // 16, 256)
  else:
    states_KNP, _ = ldlq(w_IO, l_II, bits, codebook, chunk)

  return EXL3Weight(
    trellis=pack_states(states_KNP, bits),
    suh=suh_I,
    svh=svh_O,
    bias=None if bias is None else jnp.pad(jnp.asarray(bias), (0, n_out_p - n_out)),
    codebook=codebook,
    in_features=n_in,
    out_features=n_out,
  )
