"""The object `specdec.load` returns: config, params, tokenizer and a full-sequence forward."""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from specdec.models.config import ModelConfig
from specdec.models.transformer import ForwardOut, KVCache, Transformer


@functools.partial(jax.jit, static_argnames=("config", "dtype", "taps"))
def forward(
  params, tokens_BT, config: ModelConfig, dtype, taps: tuple[int, ...] = ()
) -> ForwardOut:
  """Full-sequence causal forward from position 0 (logits, taps, final-norm hidden)."""
  B, T = tokens_BT.shape
  positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  cache = KVCache.zeros(config, B, T, dtype)
  return Transformer(config, dtype).apply(params, tokens_BT, positions_BT, cache, taps=taps)


@dataclasses.dataclass
class Model:
  config: ModelConfig
  params: Any  # {"params": ...}, the Flax variables of `module`
  tokenizer: Any = None  # tokenizers.Tokenizer or None
  dtype: Any = jnp.bfloat16

  @property
  def module(self) -> Transformer:
    return Transformer(self.config, self.dtype)

  def logits(self, tokens_BT) -> jax.Array:
    """int [B, T] -> float32 logits [B, T, V] for every position (causal, from position 0)."""
    tokens_BT = jnp.asarray(tokens_BT, jnp.int32)
    if tokens_BT.ndim != 2:
      raise ValueError(f"tokens must be [B, T], got shape {tokens_BT.shape}")
    return forward(self.params, tokens_BT, self.config, self.dtype).logits

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
    cache = KVCache.zeros(config, 1, 1, dtype)
    params = Transformer(config, dtype).init(jax.random.key(seed), tok, tok, cache)
    params = jax.tree.map(lambda p: (p * scale if p.ndim > 1 else p).astype(dtype), params)
    return Model(config=config, params=params, dtype=dtype)
