"""`QuantizedWeight`: what every quantized weight type offers the rest of the code.

A weight type (NVFP4Weight, FP8Weight, EXL3Weight) is a JAX pytree that holds the checkpoint's
data and knows its logical shape and its dequantization; nothing else. Which matmul runs it (a
Mosaic GPU kernel or XLA's dot on the dequantized weight) is decided in one place,
specdec.ops.qmatmul.matmul.
"""

from typing import Protocol, runtime_checkable

import jax
import jax.numpy as jnp


@runtime_checkable
class QuantizedWeight(Protocol):
  """A quantized (in, out) weight, registered as a JAX pytree."""

  @property
  def shape(self) -> tuple[int, int]:
    """Logical (in, out) shape of the dense weight it stands for."""
    ...

  def dequantize(self, dtype=jnp.bfloat16) -> jax.Array:
    """The dense (in, out) weight: the reference and the XLA path of the matmul."""
    ...
