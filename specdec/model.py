"""The object `specdec.load` returns: config, params, tokenizer and a full-sequence forward."""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from specdec.models import stack
from specdec.models.config import ModelConfig
from specdec.models.transformer import ForwardOut, Transformer
from specdec.ops.kv_cache import FP8, FP8_MAX, KV_SCALES


@functools.partial(jax.jit, static_argnames=("config", "dtype", "taps", "kv_dtype"))
def forward(
  params, tokens_BT, config: ModelConfig, dtype, taps: tuple[int, ...] = (), kv_dtype=None
) -> ForwardOut:
  """Full-sequence causal forward from position 0 (logits, taps, final-norm hidden).

  kv_dtype: the cache the forward writes and attends through (None: `dtype`); an FP8 cache makes
  these logits the ones decoding with that cache sees.
  """
  B, T = tokens_BT.shape
  positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  cache = stack.empty_cache(config, B, T, kv_dtype or dtype)
  n_commit_B = jnp.full((B,), T, jnp.int32)  # every token is real: a settled hybrid cache
  module = stack.decoder(config, dtype)
  return module.apply(
    params, tokens_BT, positions_BT, cache, taps=taps, n_commit_B=n_commit_B, from_zero=True
  )


@dataclasses.dataclass
class Model:
  config: ModelConfig
  params: Any  # {"params": ...}, the Flax variables of `module`
  tokenizer: Any = None  # tokenizers.Tokenizer or None
  dtype: Any = jnp.bfloat16
  kv_dtype: Any = None  # the KV cache decoding uses unless told otherwise; None: `dtype`

  @property
  def module(self) -> Transformer:
    return stack.decoder(self.config, self.dtype)

  def logits(self, tokens_BT) -> jax.Array:
    """int [B, T] -> float32 logits [B, T, V] for every position (causal, from position 0)."""
    tokens_BT = jnp.asarray(tokens_BT, jnp.int32)
    if tokens_BT.ndim != 2:
      raise ValueError(f"tokens must be [B, T], got shape {tokens_BT.shape}")
    return forward(self.params, tokens_BT, self.config, self.dtype, kv_dtype=self.kv_dtype).logits

  def kv_scales(self) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer (k [L], v [L]) FP8 KV scales as attention uses them (1.0 where none is set)."""
    attn = [self.params["params"][f"layer_{i}"]["attn"] for i in range(self.config.num_layers)]
    return tuple(np.array([float(a.get(n, 1.0)) for a in attn], np.float32) for n in KV_SCALES)

  def calibrate_kv_scales(self, tokens_BT) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer (k [L], v [L]) scales amax(|K|) / 448, amax(|V|) / 448 over a float32-cache
    forward of tokens: the largest value seen lands on the top e4m3 code. For `with_fp8_kv`."""
    out = forward(
      self.params, jnp.asarray(tokens_BT, jnp.int32), self.config, self.dtype, (), jnp.float32
    )
    return tuple(
      np.array([float(jnp.abs(c).max()) / FP8_MAX for c in cs], np.float32)
      for cs in (out.cache.k, out.cache.v)
    )

  def with_fp8_kv(self, k_scales=None, v_scales=None) -> "Model":
    """A copy that decodes with an FP8 (e4m3) KV cache: K/V stored as clip(x / scale, +-448),
    read as code * scale. Scales: a scalar or one per layer; None keeps the model's own (a loaded
    FP8-KV checkpoint's), else 1.0, which suits K/V well inside +-448 but is no calibration."""
    flat = flatten_dict(self.params["params"])
    for name, given, have_L in zip(KV_SCALES, (k_scales, v_scales), self.kv_scales(), strict=True):
      s_L = have_L if given is None else self._check_scales(name, given)
      for i, s in enumerate(s_L):
        flat[(f"layer_{i}", "attn", name)] = jnp.asarray(s, jnp.float32)
    return dataclasses.replace(self, params={"params": unflatten_dict(flat)}, kv_dtype=FP8)

  def _check_scales(self, name: str, given) -> np.ndarray:
    L = self.config.num_layers
    s = np.asarray(given, np.float64)
    if s.shape not in ((), (L,)) or not np.all(np.isfinite(s) & (s > 0)):
      raise ValueError(
        f"{name}s: expected a finite scale > 0, scalar or one per layer [{L}]; got {given!r}"
      )
    return np.broadcast_to(s, (L,)).astype(np.float32)

  def encode(self, text: str) -> list[int]:
    if self.tokenizer is None:
      raise ValueError("this model has no tokenizer.json; pass token ids instead of text")
    return self.tokenizer.encode(text).ids

  def decode(self, ids) -> str:
    if self.tokenizer is None:
      return " ".join(str(int(i)) for i in ids)
    return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

  @staticmethod
  def random(config: ModelConfig, seed: int = 0, dtype=jnp.float32, scale: float = 1.0) -> "Model":
    """A randomly initialised model (tests, speed benchmarks)."""
    tok = jnp.zeros((1, 1), jnp.int32)
    cache = stack.empty_cache(config, 1, 1, dtype)
    params = stack.decoder(config, dtype).init(jax.random.key(seed), tok, tok, cache)
    params = jax.tree.map(lambda p: (p * scale if p.ndim > 1 else p).astype(dtype), params)
    return Model(config=config, params=params, dtype=dtype)
