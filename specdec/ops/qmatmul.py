"""One dispatching matmul for every linear layer.

Dense weights are plain arrays stored (in, out). A quantized weight is a pytree type that implements
the `QuantizedWeight` protocol; the model never needs to know which format it holds.
"""

from typing import Protocol, runtime_checkable

import jax
import jax.numpy as jnp


@runtime_checkable
class QuantizedWeight(Protocol):
  """What a quantized weight type offers the model (registered as a JAX pytree)."""

  @property
  def shape(self) -> tuple[int, int]:
    """Logical (in, out) shape of the dense weight it stands for."""
    ...

  def dequantize(self, dtype=jnp.bfloat16) -> jax.Array:
    """The dense (in, out) weight: the reference path and the CPU fallback."""
    ...

  def matmul(self, x_MK: jax.Array) -> jax.Array:
    """x [..., in] -> [..., out]; a GPU kernel where one exists, else dequantize + XLA dot."""
    ...


def matmul(x: jax.Array, w) -> jax.Array:
  """x [..., in] @ w (in, out) -> [..., out], in x's dtype."""
  if isinstance(w, QuantizedWeight):
    return w.matmul(x).astype(x.dtype)
  return jnp.einsum("...i,io->...o", x, w.astype(x.dtype))
