"""The one error type for quantized-weight formats, layouts and configs."""


class QuantFormatError(ValueError):
  """A quantized weight, checkpoint tensor or quant config that cannot be used.

  The message names the tensor (`model.layers.3.mlp.up_proj.weight_scale`) or config key
  (`quantization_config.quant_algo`), so a bad checkpoint fails at load time, before any compile.
  """
