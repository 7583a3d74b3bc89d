"""`config.json: quantization_config` of an EXL3 model (exllamav3 `conversion/compile.py`).

It is informational: each tensor's K comes from its trellis shape and its codebook from the
`.mcg`/`.mul1` tensor present, never from this config. `bits` is the model-wide average.
"""

import dataclasses
from typing import Any

from specdec.quant.exl3.codebook import Codebook
from specdec.quant.exl3.errors import EXL3FormatError

OUT_SCALES = ("always", "never", "auto")


@dataclasses.dataclass(frozen=True)
class EXL3Config:
  bits: float  # average bits per weight over the model
  head_bits: int | None = None  # K of lm_head
  codebook: Codebook | None = None  # absent before exllamav3 wrote it (then 3INST was the default)
  out_scales: str | None = None  # "always" | "never" | "auto"
  version: str | None = None  # of the writer
  calibration: dict[str, int] | None = None  # {"rows": ..., "cols": ...}
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # keys kept, not interpreted


_KNOWN = {"quant_method", "bits", "head_bits", "codebook", "out_scales", "version", "calibration"}


def parse_quantization_config(config: dict[str, Any]) -> EXL3Config:
  """From a whole config.json dict (or its `quantization_config` alone)."""
  qc = config if "quant_method" in config else config.get("quantization_config")
  if not isinstance(qc, dict):
    raise EXL3FormatError("config.json: no quantization_config")
  if qc.get("quant_method") != "exl3":
    raise EXL3FormatError(
      f"quantization_config.quant_method: {qc.get('quant_method')!r}, expected 'exl3'"
    )
  bits = qc.get("bits")
  if isinstance(bits, bool) or not isinstance(bits, int | float) or not 1 <= bits <= 8:
    raise EXL3FormatError(f"quantization_config.bits: {bits!r}, expected a number in [1, 8]")
  codebook = qc.get("codebook")
  if codebook is not None and codebook not in Codebook:
    raise EXL3FormatError(f"quantization_config.codebook: unknown codebook {codebook!r}")
  out_scales = qc.get("out_scales")
  if out_scales is not None and out_scales not in OUT_SCALES:
    raise EXL3FormatError(
      f"quantization_config.out_scales: {out_scales!r}, expected one of {OUT_SCALES}"
    )
  return EXL3Config(
    bits=float(bits),
    head_bits=qc.get("head_bits"),
    codebook=None if codebook is None else Codebook(codebook),
    out_scales=out_scales,
    version=qc.get("version"),
    calibration=qc.get("calibration"),
    extra={k: v for k, v in qc.items() if k not in _KNOWN},
  )


def quantization_config(cfg: EXL3Config) -> dict[str, Any]:
  """The `quantization_config` dict exllamav3 writes, from `cfg`."""
  qc: dict[str, Any] = {
    "quant_method": "exl3",
    "version": cfg.version or "specdec",
    "bits": cfg.bits,
  }
  if cfg.head_bits is not None:
    qc["head_bits"] = cfg.head_bits
  if cfg.calibration is not None:
    qc["calibration"] = dict(cfg.calibration)
  if cfg.out_scales is not None:
    qc["out_scales"] = cfg.out_scales
  if cfg.codebook is not None:
    qc["codebook"] = str(cfg.codebook)
  return qc | cfg.extra
