"""The one error type of the EXL3 format code."""

from specdec.quant.errors import QuantFormatError


class EXL3FormatError(QuantFormatError):
  """A checkpoint or config that is not valid EXL3; the message names the tensor or key."""
