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

Under a context mesh (`jax.set_mesh`) with a "tensor" axis > 1, a quantized matmul runs per device
over its shard of the weight inside `shard_map` (`by_tensor`), whichever path it takes there: a
Pallas call is opaque to XLA's partitioner, which would gather the whole weight on every device.
An EXL3 shard is a weight of its own (its Hadamard rotations are block-diagonal at 128 and a
shard holds whole blocks), so the same kernel or XLA path runs on it unchanged.
"""

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from kernels_pallas import exl3_gemv, fp8_gemv, nvfp4_gemv
from specdec import sharding
from specdec.quant.base import QuantizedWeight
from specdec.quant.exl3 import EXL3Weight
from specdec.quant.fp8 import FP8Weight
from specdec.quant.nvfp4 import NVFP4Weight

IMPLEMENTATIONS = (None, "mosaic", "xla")
SPLITS = (None, "columns", "rows")


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


def matmul(
  x: jax.Array, w, *, implementation: str | None = None, split: str | None = None
) -> jax.Array:
  """x [..., in] @ w (in, out) -> [..., out], in x's dtype; `implementation` as in the module
  docstring (a dense w has no kernel: None and "xla" are its einsum, which XLA partitions).
  split: how w is split over a tensor axis ("columns", "rows" or None: `sharding.split_of` of
  the layer's name), which `by_tensor` follows for a quantized w."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"unknown implementation {implementation!r}; expected one of {IMPLEMENTATIONS}"
    )
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
  if not isinstance(w, QuantizedWeight):
    if implementation == "mosaic":
      raise ValueError(
        "implementation='mosaic' needs a quantized weight; a dense one has no kernel"
      )
    return jnp.einsum("...i,io->...o", x, w.astype(x.dtype))
  return by_tensor(functools.partial(_quantized, implementation=implementation), w, split)(x, w)


def _quantized(x: jax.Array, w: QuantizedWeight, implementation: str | None) -> jax.Array:
  if implementation == "mosaic" or (implementation is None and uses_kernel(x, w)):
    kernel = KERNELS.get(type(w))
    if kernel is None:
      raise ValueError(f"implementation='mosaic': no kernel for {type(w).__name__}")
    y_MN = kernel.matmul(x.reshape(-1, x.shape[-1]), w)
    return y_MN.reshape(*x.shape[:-1], y_MN.shape[-1]).astype(x.dtype)
  return xla_matmul(x, w).astype(x.dtype)


def by_tensor(fn, w: QuantizedWeight, split: str | None):
  """`fn(x, w)` run per device over its shard of w when the context mesh has a "tensor" axis > 1
  and `split` says how w is split: "columns" gives each device its output features (no
  reduction, y split by them), "rows" its input features and x's matching slice (the partial
  outputs summed in f32 by a psum, y replicated; an EXL3 weight's bias added once, after the
  sum). Otherwise fn as is."""
  mesh = jax.sharding.get_abstract_mesh()
  tensor = 1 if mesh.empty else mesh.shape.get("tensor", 1)
  if tensor == 1 or split is None:
    return fn

  def sharded(x, w):
    bias = getattr(w, "bias", None) if split == "rows" else None
    if bias is not None:
      w = dataclasses.replace(w, bias=None)
    w_specs = sharding.quantized_specs(w, split, tensor, f"a {split}-split {type(w).__name__}")
    by_last = P(*(None,) * (x.ndim - 1), "tensor")
    local = lambda x, w: fn(x, _shard(w, split, tensor))  # noqa: E731
    if split == "columns":
      body, x_spec, y_spec = local, P(), by_last
    else:
      body = lambda x, w: jax.lax.psum(local(x, w).astype(jnp.float32), "tensor")  # noqa: E731
      x_spec, y_spec = by_last, P()
    run = jax.shard_map(
      body, mesh=mesh, in_specs=(x_spec, w_specs), out_specs=y_spec, check_vma=False
    )
    y = run(x, w)
    if bias is not None:
      y = y + bias[: w.out_features].astype(jnp.float32)
    return y.astype(x.dtype)

  return sharded


def _shard(w: QuantizedWeight, split: str, tensor: int) -> QuantizedWeight:
  """The weight one device holds inside `shard_map`: an EXL3 weight's static feature counts are
  the whole weight's there, so its split one is divided (exact: `sharding.check_exl3_split`);
  NVFP4 and FP8 read their shapes from their arrays."""
  if not isinstance(w, EXL3Weight):
    return w
  if split == "columns":
    return dataclasses.replace(w, out_features=w.out_features // tensor)
  return dataclasses.replace(w, in_features=w.in_features // tensor)


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
