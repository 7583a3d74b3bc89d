"""The one matmul of every linear layer, and the one place that picks kernel or XLA for it.

Dense weights are plain arrays stored (in, out). A quantized weight is a pytree type that
implements `QuantizedWeight` (specdec.quant.base: its shape and its dequantization); the model
never needs to know which format it holds. `matmul(x, w, implementation=...)` decides, for every
quantized type at once (tokamax's `implementation=` idea):

  None      auto: the type's Mosaic GPU kernel where the backend is a GPU, x is bf16 and the
            kernel takes the shape (its `check_shape`: e.g. M <= 16, an unbatched weight), else XLA
  "xla"     dequantize to x's dtype and XLA's dot (+ an EXL3 weight's bias); always available
  "mosaic"  the kernel, on whatever shape it is given (its own checks raise where it cannot run)

The kernels (kernels_pallas) know nothing of this choice: each offers its matmul and `check_shape`.
"""

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from kernels_pallas import exl3_gemv, fp8_gemv, nvfp4_gemv
from specdec.quant.base import QuantizedWeight
from specdec.quant.exl3 import EXL3Weight
from specdec.quant.fp8 import FP8Weight
from specdec.quant.nvfp4 import NVFP4Weight

IMPLEMENTATIONS = (None, "mosaic", "xla")


@dataclasses.dataclass(frozen=True)
class Kernel:
  """A quantized type's GPU kernel: matmul(x [M, K], w) -> [M, N], and check_shape(M, w), which
  raises ValueError where the kernel does not take the shape."""

  matmul: Callable[[jax.Array, QuantizedWeight], jax.Array]
  check_shape: Callable[[int, QuantizedWeight], None]


KERNELS: dict[type, Kernel] = {
  NVFP4Weight: Kernel(nvfp4_gemv.nvfp4_matmul, nvfp4_gemv.check_shape),
  FP8Weight: Kernel(fp8_gemv.fp8_matmul, fp8_gemv.check_shape),
  EXL3Weight: Kernel(exl3_gemv.exl3_matmul, exl3_gemv.check_shape),
}


def matmul(x: jax.Array, w, *, implementation: str | None = None) -> jax.Array:
  """x [..., in] @ w (in, out) -> [..., out], in x's dtype; `implementation` as in the module
  docstring (a dense w has no kernel: None and "xla" are its einsum)."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"unknown implementation {implementation!r}; expected one of {IMPLEMENTATIONS}"
    )
  if not isinstance(w, QuantizedWeight):
    if implementation == "mosaic":
      raise ValueError(
        "implementation='mosaic' needs a quantized weight; a dense one has no kernel"
      )
    return jnp.einsum("...i,io->...o", x, w.astype(x.dtype))
  if implementation == "mosaic" or (implementation is None and uses_kernel(x, w)):
    kernel = KERNELS.get(type(w))
    if kernel is None:
      raise ValueError(f"implementation='mosaic': no kernel for {type(w).__name__}")
    y_MN = kernel.matmul(x.reshape(-1, x.shape[-1]), w)
    return y_MN.reshape(*x.shape[:-1], y_MN.shape[-1]).astype(x.dtype)
  return xla_matmul(x, w).astype(x.dtype)


def uses_kernel(x: jax.Array, w: QuantizedWeight) -> bool:
  """Whether `matmul`'s auto mode runs w's kernel for x: a GPU backend, bf16 x, and a kernel whose
  `check_shape` takes M = the rows of x (all leading dimensions)."""
  kernel = KERNELS.get(type(w))
  if kernel is None or jax.default_backend() != "gpu" or x.dtype != jnp.bfloat16:
    return False
  try:
    kernel.check_shape(math.prod(x.shape[:-1]), w)
  except ValueError:
    return False
  return True


def xla_matmul(x: jax.Array, w: QuantizedWeight) -> jax.Array:
  """The XLA path: w dequantized to x's dtype, XLA's dot, plus an EXL3 weight's bias."""
  y = jnp.einsum("...i,io->...o", x, w.dequantize(x.dtype))
  if isinstance(w, EXL3Weight) and w.bias is not None:
    y = y + w.bias[: w.out_features].astype(y.dtype)
  return y
