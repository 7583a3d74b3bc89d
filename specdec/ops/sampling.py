"""Sampling transforms, applied in ONE order everywhere: temperature, then top-k, then top-p.

This is the order vLLM applies on GPU. The same transform is applied to the target distribution
and, under full-q acceptance, to the draft distribution, so acceptance compares like with like.
Temperature 0 means greedy: the distribution is the one-hot of the argmax.
"""

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Sampling:
  temperature: float = 0.0
  top_k: int = 0  # 0: off
  top_p: float = 1.0  # 1.0: off

  def validate(self) -> None:
    if not self.temperature >= 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if not (isinstance(self.top_k, int) and self.top_k >= 0):
      raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


def probs(logits_V, s: Sampling) -> jax.Array:
  """float32 probabilities over the last axis after the transforms."""
  logits_V = logits_V.astype(jnp.float32)
  V = logits_V.shape[-1]
  if s.greedy:
    return jax.nn.one_hot(jnp.argmax(logits_V, -1), V, dtype=jnp.float32)
  logits_V = logits_V / s.temperature
  if 0 < s.top_k < V:
    kth = jax.lax.top_k(logits_V, s.top_k)[0][..., -1:]
    logits_V = jnp.where(logits_V < kth, -jnp.inf, logits_V)
  p_V = jax.nn.softmax(logits_V, -1)
  if s.top_p < 1.0:
    # Keep the smallest prefix of the sorted distribution whose mass reaches top_p (ties at the
    # boundary kept, as in vLLM); the most likely token is always kept.
    sorted_V = jnp.sort(p_V, -1)[..., ::-1]
    before_V = jnp.cumsum(sorted_V, -1) - sorted_V
    kept_V = before_V < s.top_p
    threshold = jnp.min(jnp.where(kept_V, sorted_V, jnp.inf), -1, keepdims=True)
    p_V = jnp.where(p_V >= threshold, p_V, 0.0)
    p_V = p_V / jnp.sum(p_V, -1, keepdims=True)
  return p_V


def sample(key, p_V) -> jax.Array:
  """One token per row from probabilities (exact zeros are never drawn)."""
  return jax.random.categorical(key, jnp.log(p_V), axis=-1).astype(jnp.int32)
