"""Read and write one EXL3 linear layer in the exllamav3 checkpoint layout.

Tensors of a layer with key P (exllamav3 `modules/quant/exl3.py`, `modules/linear.py`):
  P.trellis  int16 [in_p/16, out_p/16, 16K]  K bits per weight, per tensor (1..8)
  P.suh      f16   [in_p]                     input-side sign x scale (real-valued, never binarize)
  P.svh      f16   [out_p]                    output-side sign x scale
  P.mcg | P.mul1  int32 scalar (optional)     which codebook; neither means 3INST
  P.bias     [out_p] (optional)
in_p, out_p: the logical dims zero-padded to multiples of 128; the weight is stored (in, out).
"""

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from specdec.quant.exl3.bitstream import MAX_BITS
from specdec.quant.exl3.codebook import MCG_MULT, MUL1_MULT, Codebook
from specdec.quant.exl3.errors import EXL3FormatError
from specdec.quant.exl3.hadamard import HAD_DIM
from specdec.quant.exl3.layout import TILE_DIM, pad_to
from specdec.quant.exl3.weight import EXL3Weight

_MULTIPLIERS = {"mcg": (Codebook.MCG, MCG_MULT), "mul1": (Codebook.MUL1, MUL1_MULT)}


def _check_dtype(name: str, array: np.ndarray, dtype) -> None:
  if array.dtype != dtype:
    raise EXL3FormatError(f"{name}: dtype {array.dtype}, expected {np.dtype(dtype).name}")


def _read_trellis(name: str, trellis: np.ndarray) -> None:
  _check_dtype(name, trellis, np.int16)
  if trellis.ndim != 3:
    raise EXL3FormatError(f"{name}: shape {trellis.shape}, expected [in/16, out/16, 16*K]")
  last = trellis.shape[-1]
  if last % 16 or not 1 <= last // 16 <= MAX_BITS:
    raise EXL3FormatError(
      f"{name}: last dimension {last} is not 16*K for K bits per weight in 1..{MAX_BITS}"
    )


def _check_padded(name: str, dim: str, stored: int, logical: int | None, pad_multiple: int):
  if stored % pad_multiple:
    raise EXL3FormatError(
      f"{name}: {dim} dimension {stored} is not padded to a multiple of {pad_multiple}"
    )
  if logical is not None and stored != pad_to(logical, pad_multiple):
    raise EXL3FormatError(
      f"{name}: {dim} dimension {stored} does not match {dim}_features={logical} padded to a "
      f"multiple of {pad_multiple} ({pad_to(logical, pad_multiple)})"
    )


def _read_scale(name: str, scale: np.ndarray, length: int, side: str) -> np.ndarray:
  _check_dtype(name, scale, np.float16)
  if scale.shape != (length,):
    raise EXL3FormatError(
      f"{name}: shape {scale.shape}, expected ({length},) to match the trellis' {side} dimension"
    )
  return scale


def _read_codebook(prefix: str, get_tensor, has_tensor) -> Codebook:
  present = [s for s in _MULTIPLIERS if has_tensor(f"{prefix}.{s}")]
  if len(present) > 1:
    raise EXL3FormatError(
      f"{prefix}: both {prefix}.mcg and {prefix}.mul1 present; pick one codebook"
    )
  if not present:
    return Codebook.INST3
  name = f"{prefix}.{present[0]}"
  codebook, expected = _MULTIPLIERS[present[0]]
  value = np.asarray(get_tensor(name))
  if value.size != 1 or value.dtype not in (np.int32, np.uint32):
    raise EXL3FormatError(f"{name}: expected one int32 multiplier, got {value.dtype} {value.shape}")
  stored = int(value.reshape(()).astype(np.uint32))
  # exllamav3 locked the multipliers in 0f2da5d and never reads this value: a different one would
  # decode as something other than what was encoded (pre-lock experimental checkpoints).
  if stored != expected:
    raise EXL3FormatError(
      f"{name}: unknown multiplier {stored:#010x}; {present[0]} decodes with {expected:#010x}"
    )
  return codebook


def read_linear(
  prefix: str,
  get_tensor: Callable[[str], np.ndarray],
  has_tensor: Callable[[str], bool],
  *,
  in_features: int | None = None,
  out_features: int | None = None,
  pad_multiple: int = HAD_DIM,
) -> EXL3Weight:
  """Load the EXL3 tensors of layer `prefix`; every format error names the offending tensor.

  in_features / out_features: the logical dims from the model config (default: the stored, padded
  dims); the stored dims must be these padded up to `pad_multiple`.
  """
  for legacy, current in (("su", "suh"), ("sv", "svh")):
    if has_tensor(f"{prefix}.{legacy}") and not has_tensor(f"{prefix}.{current}"):
      raise EXL3FormatError(
        f"{prefix}.{legacy}: legacy packed-sign layout (int16 sign bits, no {current}) is not "
        f"supported; it predates exllamav3's first release, which writes real-valued {current}"
      )
  for suffix in ("trellis", "suh", "svh"):
    if not has_tensor(f"{prefix}.{suffix}"):
      raise EXL3FormatError(f"{prefix}.{suffix}: missing (an EXL3 layer needs trellis, suh, svh)")

  trellis = np.asarray(get_tensor(f"{prefix}.trellis"))
  _read_trellis(f"{prefix}.trellis", trellis)
  n_in_p, n_out_p = trellis.shape[0] * TILE_DIM, trellis.shape[1] * TILE_DIM
  _check_padded(f"{prefix}.trellis", "in", n_in_p, in_features, pad_multiple)
  _check_padded(f"{prefix}.trellis", "out", n_out_p, out_features, pad_multiple)
  suh = _read_scale(f"{prefix}.suh", np.asarray(get_tensor(f"{prefix}.suh")), n_in_p, "input")
  svh = _read_scale(f"{prefix}.svh", np.asarray(get_tensor(f"{prefix}.svh")), n_out_p, "output")
  codebook = _read_codebook(prefix, get_tensor, has_tensor)

  bias = None
  if has_tensor(f"{prefix}.bias"):
    bias = np.asarray(get_tensor(f"{prefix}.bias"))
    if not np.issubdtype(bias.dtype, np.floating) and bias.dtype.name != "bfloat16":
      raise EXL3FormatError(f"{prefix}.bias: dtype {bias.dtype}, expected a float type")
    if bias.shape not in ((n_out_p,), (out_features,)):
      raise EXL3FormatError(
        f"{prefix}.bias: shape {bias.shape}, expected ({n_out_p},) (padded out dimension)"
      )
    bias = jnp.pad(jnp.asarray(bias), (0, n_out_p - bias.shape[0]))

  return EXL3Weight(
    trellis=jnp.asarray(trellis),
    suh=jnp.asarray(suh),
    svh=jnp.asarray(svh),
    bias=bias,
    codebook=codebook,
    in_features=n_in_p if in_features is None else in_features,
    out_features=n_out_p if out_features is None else out_features,
  )


def write_linear(prefix: str, w: EXL3Weight) -> dict[str, np.ndarray]:
  """The checkpoint tensors of `w` under `prefix`, as exllamav3 names and types them."""
  tensors = {
    f"{prefix}.trellis": np.asarray(w.trellis, np.int16),
    f"{prefix}.suh": np.asarray(w.suh, np.float16),
    f"{prefix}.svh": np.asarray(w.svh, np.float16),
  }
  for suffix, (codebook, mult) in _MULTIPLIERS.items():
    if w.codebook == codebook:
      # A 0-d int32 holding the uint32 multiplier's bits, as exllamav3 saves it.
      tensors[f"{prefix}.{suffix}"] = np.array(mult, np.uint32).view(np.int32)
  if w.bias is not None:
    tensors[f"{prefix}.bias"] = np.asarray(w.bias)
  return tensors
