"""attend's from_zero path (a full-sequence forward from position 0): cuDNN's fused causal
attention on a GPU, the same values and gradients as `attend_xla` within bf16 rounding; elsewhere
exactly `attend_xla`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.models import stack
from specdec.models.config import ModelConfig
from specdec.ops.attention import attend, attend_xla


def qkv(B, T, N, K, H, dtype, seed=0):
  r = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(r.normal(size=(B, T, n, H)), dtype) for n in (N, K, K))
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  return q, k, v, positions


def both(q, k, v, positions):
  """(from_zero path, attend_xla): outputs and the gradients of a fixed projection of them."""
  w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)

  def loss(fn):
    return lambda q, k, v: (fn(q, k, v).astype(jnp.float32) * w).sum()

  fast = jax.jit(lambda q, k, v: attend(q, k, v, positions, from_zero=True))
  slow = jax.jit(lambda q, k, v: attend_xla(q, k, v, positions))
  return [
    (fn(q, k, v), jax.jit(jax.grad(loss(fn), argnums=(0, 1, 2)))(q, k, v)) for fn in (fast, slow)
  ]


def test_off_a_gpu_the_path_is_attend_xla_exactly():
  if jax.default_backend() == "gpu":
    pytest.skip("a GPU takes the cuDNN path (the gpu tests below)")
  q, k, v, positions = qkv(2, 16, 4, 2, 8, jnp.bfloat16)
  (o, g), (o_ref, g_ref) = both(q, k, v, positions)
  np.testing.assert_array_equal(np.asarray(o, np.float32), np.asarray(o_ref, np.float32))
  for a, b in zip(g, g_ref, strict=True):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def max_rel(a, b):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.gpu
def test_cudnn_runs_and_matches_attend_xla_with_gqa():
  q, k, v, positions = qkv(2, 1024, 8, 2, 64, jnp.bfloat16)
  hlo = jax.jit(lambda q, k, v: attend(q, k, v, positions, from_zero=True)).lower(q, k, v)
  assert "cudnn" in hlo.compile().as_text().lower()  # the fused kernel, not a fallback
  (o, g), (o_ref, g_ref) = both(q, k, v, positions)
  assert max_rel(o, o_ref) < 2e-2  # bf16 outputs: ~3 significant digits
  for a, b in zip(g, g_ref, strict=True):
    assert max_rel(a, b) < 3e-2


@pytest.mark.gpu
def test_a_training_forward_gives_the_xla_loss_and_gradient():
  config = ModelConfig(
    model_type="qwen3", vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-6, rope_theta=1e4,
    max_position_embeddings=512, tie_word_embeddings=True, qk_norm=True, attention_bias=False,
    mlp_bias=False,
  )  # fmt: skip
  module = stack.decoder(config, jnp.bfloat16)
  B, T = 2, 512
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 512, (B, T)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  cache = stack.empty_cache(config, B, T, jnp.bfloat16)
  params = module.init(jax.random.key(0), tokens[:, :1], positions[:, :1], cache)

  def loss(params, from_zero):
    logits = module.apply(params, tokens, positions, cache, from_zero=from_zero).logits
    logp = jax.nn.log_softmax(logits[:, :-1])
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()

  (l_fast, g_fast), (l_ref, g_ref) = (
    jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, z) for z in (True, False)
  )
  assert abs(float(l_fast) - float(l_ref)) < 1e-2 * float(l_ref)
  for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_ref), strict=True):
    assert max_rel(a, b) < 5e-2
