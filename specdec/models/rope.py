"""Rotary position embeddings with the rope_scaling variants Qwen3 and Llama checkpoints use."""

import functools
import math

import jax.numpy as jnp
import numpy as np

from specdec.models.config import ModelConfig


def _yarn(inv_freq: np.ndarray, c: ModelConfig, s: dict) -> tuple[np.ndarray, float]:
  dim, base, factor = c.head_dim, c.rope_theta, float(s["factor"])
  orig = s.get("original_max_position_embeddings") or c.max_position_embeddings
  beta_fast, beta_slow = s.get("beta_fast") or 32.0, s.get("beta_slow") or 1.0

  def mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

  attn_factor = s.get("attention_factor")
  if attn_factor is None:
    if s.get("mscale") and s.get("mscale_all_dim"):
      attn_factor = mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
    else:
      attn_factor = mscale(factor)

  def correction_dim(rotations):
    return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

  low, high = correction_dim(beta_fast), correction_dim(beta_slow)
  if s.get("truncate", True):
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
  extrapolation = 1 - ramp
  inv = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
  return inv, float(attn_factor)


def _llama3(inv_freq: np.ndarray, s: dict) -> np.ndarray:
  factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
  old_len = s["original_max_position_embeddings"]
  wavelen = 2 * math.pi / inv_freq
  scaled = np.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
  smooth = (old_len / wavelen - lo) / (hi - lo)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= old_len / hi) & (wavelen <= old_len / lo)
  return np.where(medium, smoothed, scaled)


@functools.cache  # every attention layer asks at trace time; the answer depends on the config only
def inv_freq_and_scale(c: ModelConfig) -> tuple[np.ndarray, float]:
  """Per-pair inverse frequencies [H/2] (read-only) and the factor cos/sin are multiplied by."""
  inv_freq, scale = _inv_freq_and_scale(c)
  inv_freq.flags.writeable = False  # shared by every caller
  return inv_freq, scale


def _inv_freq_and_scale(c: ModelConfig) -> tuple[np.ndarray, float]:
  exponents = np.arange(0, c.head_dim, 2, dtype=np.int64).astype(np.float32) / c.head_dim
  inv_freq = 1.0 / (c.rope_theta**exponents)
  s = c.rope_scaling_dict
  kind = s.get("rope_type", "default")
  if kind == "linear":
    return inv_freq / s["factor"], 1.0
  if kind == "llama3":
    return _llama3(inv_freq, s), 1.0
  if kind == "yarn":
    return _yarn(inv_freq, c, s)
  return inv_freq, 1.0


def apply_rope(x_BTNH, positions_BT, inv_freq_h, scale: float):
  """Rotate-half convention (HF): pairs are (i, i + H/2)."""
  angles_BTh = positions_BT[..., None].astype(jnp.float32) * jnp.asarray(inv_freq_h, jnp.float32)
  cos_BT1H = jnp.concatenate([jnp.cos(angles_BTh)] * 2, -1)[:, :, None, :] * scale
  sin_BT1H = jnp.concatenate([jnp.sin(angles_BTh)] * 2, -1)[:, :, None, :] * scale
  x = x_BTNH.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
  return (x * cos_BT1H + rotated * sin_BT1H).astype(x_BTNH.dtype)
