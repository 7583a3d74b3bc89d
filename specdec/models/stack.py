"""The decoder module and the empty decode cache a config calls for: the dense stack
(transformer.py, a KVCache) or the hybrid one (hybrid.py, a HybridCache)."""

import jax.numpy as jnp

from specdec.models.config import HybridConfig, ModelConfig
from specdec.models.hybrid import HybridCache, HybridTransformer
from specdec.models.transformer import KVCache, Transformer


def decoder(config: ModelConfig, dtype) -> Transformer:
  return (HybridTransformer if isinstance(config, HybridConfig) else Transformer)(config, dtype)


def empty_cache(config: ModelConfig, batch: int, slots: int, dtype=jnp.bfloat16):
  kind = HybridCache if isinstance(config, HybridConfig) else KVCache
  return kind.zeros(config, batch, slots, dtype)
