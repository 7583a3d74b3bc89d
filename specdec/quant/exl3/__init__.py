"""EXL3 (exllamav3 trellis) quantized weights: format, reference decode, and quantizer."""

from specdec.quant.exl3.checkpoint import read_linear, write_linear
from specdec.quant.exl3.codebook import Codebook, codebook_lut, decode_states
from specdec.quant.exl3.config import EXL3Config, parse_quantization_config, quantization_config
from specdec.quant.exl3.errors import EXL3FormatError
from specdec.quant.exl3.quantize import quantize_linear
from specdec.quant.exl3.scale_search import ScaleSearch
from specdec.quant.exl3.weight import EXL3Weight, random_weight

__all__ = [
  "Codebook",
  "EXL3Config",
  "EXL3FormatError",
  "EXL3Weight",
  "ScaleSearch",
  "codebook_lut",
  "decode_states",
  "parse_quantization_config",
  "quantization_config",
  "quantize_linear",
  "random_weight",
  "read_linear",
  "write_linear",
]
