"""Random targets of any shape and format, and synthetic decode states, for speed benchmarks.

Weights are pseudo-random fills made on the device in their own dtype, one small jitted kernel per
leaf shape (no host transfer, no f32 copy, no per-leaf compile): speed does not depend on the
values, and a fill is not zeros. Quantized weights are random codes of the stored shapes (NVFP4:
codes, E4M3 block scales, global scales; EXL3: trellis, suh, svh). The KV cache is a fill too.
`walk_model` sets a few weights so that greedy decoding is the same at any verify width (for
benchmarks gated on greedy identity).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from specdec.decoding.memory import kv_slot_bytes, tree_bytes
from specdec.decoding.state import DecodeState, counters
from specdec.model import Model
from specdec.models.config import ModelConfig, from_hf_dict
from specdec.models.transformer import KVCache, Transformer
from specdec.quant.exl3 import Codebook, EXL3Weight
from specdec.quant.nvfp4 import GROUP, NVFP4Weight, device_order

FORMATS = ("bf16", "nvfp4", "exl3_4")
EXL3_TILE = 128  # EXL3 pads both dimensions to its 128-point Hadamard


class BenchConfigError(ValueError):
  """A benchmark config that cannot run; raised before anything compiles."""


def _hash_u32(shape, seed) -> jax.Array:
  """A cheap integer hash of each element's index: distinct per seed, fused into one kernel."""
  x = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
  x = x * jnp.uint32(0x9E3779B1) + jnp.asarray(seed).astype(jnp.uint32) * jnp.uint32(0x85EBCA77)
  x = (x ^ (x >> 15)) * jnp.uint32(0x2C1B3C6D)
  return x ^ (x >> 13)


# The seed is traced, not static: every leaf of one shape shares one executable, so building a
# model compiles a handful of small kernels instead of one per leaf.
@functools.partial(jax.jit, static_argnames=("shape", "dtype", "scale"))
def fill(shape: tuple[int, ...], dtype, seed, scale: float = 0.02) -> jax.Array:
  """Pseudo-random values of `dtype`: uniform in [-scale, scale) for floats, any bits for integers,
  and for E4M3 only finite block scales in [0.5, 1) (random bytes would include NaN codes)."""
  x = _hash_u32(shape, seed)
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float8_e4m3fn:
    return jax.lax.bitcast_convert_type(((x >> 24) & 0x7 | 0x30).astype(jnp.uint8), dtype)
  if jnp.issubdtype(dtype, jnp.floating):
    u = (x >> 8).astype(jnp.float32) * 2.0**-24
    return ((2 * u - 1) * scale).astype(dtype)
  bits = 8 * dtype.itemsize
  unsigned = jnp.dtype(f"uint{bits}")
  return jax.lax.bitcast_convert_type((x >> (32 - bits)).astype(unsigned), dtype)


def model_config(shape: dict) -> ModelConfig:
  """HF config keys (hidden_size, num_hidden_layers, ...) of a Qwen3-family dense shape."""
  return from_hf_dict(
    {"model_type": "qwen3", "max_position_embeddings": 1 << 20, **dict(shape)},
    source="bench_decode shape",
  )


def _is_quantized_kernel(path: tuple[str, ...]) -> bool:
  # As quantize_model: embeddings, norms and the LM head stay dense.
  return path[-1] == "kernel" and path[0] != "lm_head"


def _random_weight(path: tuple[str, ...], shape: tuple[int, ...], fmt: str, dtype, seed: int):
  if fmt == "bf16" or not _is_quantized_kernel(path):
    return fill(shape, dtype, seed)
  k_in, n_out = shape
  if fmt == "nvfp4":
    return NVFP4Weight(
      fill((n_out, k_in // 2), jnp.uint8, seed),
      fill((n_out, k_in // GROUP), jnp.float8_e4m3fn, seed + 1),
      fill((n_out,), jnp.float32, seed + 2),
      bit_order=device_order(),  # random bits are valid codes in either order
    )
  bits = int(fmt.split("_")[1])
  return EXL3Weight(
    fill((k_in // 16, n_out // 16, 16 * bits), jnp.int16, seed),
    fill((k_in,), jnp.float16, seed + 1, scale=1.0),
    fill((n_out,), jnp.float16, seed + 2, scale=1.0),
    None,
    Codebook.MUL1,
    k_in,
    n_out,
  )


@functools.cache  # tracing a 64-layer init takes seconds; validation and every build reuse it
def abstract_dense(config: ModelConfig, dtype=jnp.bfloat16) -> dict:
  """{path: shape} of the dense params (Flax init traced, nothing allocated)."""
  tok = jnp.zeros((1, 1), jnp.int32)
  cache = KVCache.zeros(config, 1, 1, dtype)
  tree = jax.eval_shape(Transformer(config, dtype).init, jax.random.key(0), tok, tok, cache)
  return {path: leaf.shape for path, leaf in flatten_dict(tree["params"]).items()}


def check_format(config: ModelConfig, fmt: str) -> None:
  """Raises BenchConfigError naming the first linear layer `fmt` cannot store."""
  if fmt not in FORMATS:
    raise BenchConfigError(f"unknown format {fmt!r}; choose from {FORMATS}")
  for path, shape in abstract_dense(config).items():
    if fmt == "bf16" or len(shape) != 2 or not _is_quantized_kernel(path):
      continue
    mult = GROUP if fmt == "nvfp4" else EXL3_TILE
    if shape[0] % mult or (fmt != "nvfp4" and shape[1] % mult):
      raise BenchConfigError(
        f"{'/'.join(path)} (in, out) = {shape}: {fmt} needs dimensions divisible by {mult}"
      )


def random_params(config: ModelConfig, fmt: str = "bf16", dtype=jnp.bfloat16, seed: int = 0):
  """The Flax variables of a random `fmt` model, every leaf filled on the device in its dtype."""
  dtype = jnp.dtype(dtype)
  leaves = sorted(abstract_dense(config, dtype).items())
  flat = {
    path: _random_weight(path, shape, fmt, dtype, seed + 8 * i)
    for i, (path, shape) in enumerate(leaves)
  }
  return {"params": unflatten_dict(flat)}


def random_model(config: ModelConfig, fmt: str = "bf16", dtype=jnp.bfloat16) -> Model:
  return Model(config, random_params(config, fmt, jnp.dtype(dtype)), dtype=jnp.dtype(dtype))


WALK_LOGIT = 48.0  # walk_model's logit of the next token of the walk


def walk_model(config: ModelConfig, dtype=jnp.bfloat16, seed: int = 0) -> tuple[Model, np.ndarray]:
  """A random dense target whose greedy decode is a fixed walk over the vocabulary at any verify
  width, and that walk's next token of each token ([V]).

  A random target's greedy text changes with the verify width in 16-bit compute (a width-k+1
  GEMM rounds near-ties differently from a width-1 one), which breaks a greedy gate and an oracle
  drafter's answer. Here every layer's output projections (o_proj, down_proj) are zero, so the
  residual stream stays the current token's embedding, and the LM head holds the embedding rows
  in the order of one random cycle through the vocabulary, scaled so that token t's successor
  scores about WALK_LOGIT and every other token near 0 (WALK_LOGIT / sqrt(D) per unit of noise):
  sampling at any temperature <= 1 draws the walk too. Shapes, dtype and the work of a step are
  random_model's: speed does not depend on the values.
  """
  if config.tie_word_embeddings:
    raise BenchConfigError("walk_model needs an untied LM head (tie_word_embeddings=False)")
  flat = flatten_dict(random_params(config, "bf16", dtype, seed)["params"])
  for path, w in flat.items():
    if path[-2] in ("o_proj", "down_proj"):
      flat[path] = jnp.zeros_like(w)
  flat[("final_norm", "scale")] = jnp.ones_like(flat[("final_norm", "scale")])
  order_V = np.random.default_rng(seed).permutation(config.vocab_size)
  next_V = np.empty_like(order_V)
  next_V[order_V] = np.roll(order_V, -1)  # one cycle: order[i] -> order[i + 1]
  prev_V = np.argsort(next_V)  # LM head column v is the embedding of the token before v
  embed_VD = flat[("embed", "embedding")].astype(jnp.float32)
  # The final norm scales a row to RMS 1, so its dot with itself is D x its RMS.
  scale = WALK_LOGIT / (config.hidden_size * jnp.sqrt(jnp.mean(embed_VD**2)))
  flat[("lm_head", "kernel")] = (scale * embed_VD[jnp.asarray(prev_V)].T).astype(dtype)
  return Model(config, {"params": unflatten_dict(flat)}, dtype=jnp.dtype(dtype)), next_V


def step_bytes(params, config: ModelConfig, batch: int, slots: int, kv_dtype) -> dict:
  """Bytes one decode step reads: weights as stored, and the K/V caches of all B rows."""
  weights = tree_bytes(params)
  if not config.tie_word_embeddings:
    table = params["params"]["embed"]["embedding"]
    weights += batch * table.nbytes // table.shape[0] - table.nbytes  # only B rows are gathered
  kv = batch * slots * kv_slot_bytes(config, kv_dtype)
  return {"weight_bytes": int(weights), "kv_bytes": int(kv)}


def synthetic_state(config: ModelConfig, batch: int, slots: int, start: int, k: int, dtype):
  """A decode state whose rows have committed `start` tokens, as if a prefill had run."""
  dtype = jnp.dtype(dtype)
  shape_BSKH = (batch, slots, config.num_kv_heads, config.head_dim)
  layers = range(config.num_layers)
  cache = KVCache(
    k=tuple(fill(shape_BSKH, dtype, 2 * i, scale=1.0) for i in layers),
    v=tuple(fill(shape_BSKH, dtype, 2 * i + 1, scale=1.0) for i in layers),
  )
  return DecodeState(
    tokens=(fill((batch, slots), jnp.uint32, 7) % config.vocab_size).astype(jnp.int32),
    # The state is donated, and a buffer cannot be donated twice: no leaf may share one.
    lengths=jnp.full((batch,), start, jnp.int32),
    prompt_lengths=jnp.full((batch,), start, jnp.int32),
    max_new=jnp.full((batch,), slots, jnp.int32),  # never reached: every step does full work
    cache=cache,
    draft=(),
    key=jax.random.key(0),
    done=jnp.zeros((batch,), bool),
    reject=jnp.asarray(False),
    **jax.device_put(counters(batch, k)),
  )
