"""specdec.ops.attention.with_xla_gradient: a kernel with no differentiation rule becomes
differentiable, with attend_xla's gradient (the trainers differentiate decode-shaped forwards),
under a draft tree's mask too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.decoding.tree import tree
from specdec.ops.attention import TreeMask, attend_xla, with_xla_gradient
from specdec.ops.kv_cache import FP8, from_cache

B, T, S, N, K, H = 2, 3, 8, 4, 2, 16


def opaque(q, k, v, positions, k_scale=1.0, v_scale=1.0, tree=None):
  """attend_xla's values through a host callback: no JVP rule, as a Pallas call has none."""

  def host(q, k, v, positions, k_scale, v_scale, tree):
    k, v = from_cache(k, k_scale, q.dtype), from_cache(v, v_scale, q.dtype)
    return np.asarray(attend_xla(q, k, v, positions, tree))

  out = jax.ShapeDtypeStruct(q.shape, q.dtype)
  return jax.pure_callback(host, out, q, k, v, positions, k_scale, v_scale, tree)


def inputs(seed=0):
  r = np.random.default_rng(seed)
  q = jnp.asarray(r.normal(size=(B, T, N, H)), jnp.float32)
  k = jnp.asarray(r.normal(size=(B, S, K, H)), jnp.float32)
  v = jnp.asarray(r.normal(size=(B, S, K, H)), jnp.float32)
  positions = jnp.asarray([[3, 4, 5], [5, 6, 7]], jnp.int32)
  return q, k, v, positions


def test_the_opaque_kernel_has_no_gradient_unwrapped():
  q, k, v, positions = inputs()
  with pytest.raises(Exception, match="(?i)differentiat|jvp"):
    jax.grad(lambda q: opaque(q, k, v, positions).sum())(q)


def test_gradients_are_attend_xla_s():
  q, k, v, positions = inputs()
  w = jnp.asarray(np.random.default_rng(1).normal(size=(B, T, N, H)), jnp.float32)
  kernel = with_xla_gradient(opaque)
  got = jax.grad(lambda q, k, v: (kernel(q, k, v, positions) * w).sum(), (0, 1, 2))(q, k, v)
  want = jax.grad(lambda q, k, v: (attend_xla(q, k, v, positions) * w).sum(), (0, 1, 2))(q, k, v)
  for g, r in zip(got, want, strict=True):
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(kernel(q, k, v, positions), attend_xla(q, k, v, positions), atol=1e-6)


def test_an_fp8_cache_gives_the_queries_their_gradient_under_jit():
  q, k, v, positions = inputs()
  scale = jnp.float32(0.5)
  k8, v8 = (k / scale).astype(FP8), (v / scale).astype(FP8)
  kernel = with_xla_gradient(opaque)
  got = jax.jit(jax.grad(lambda q: kernel(q, k8, v8, positions, scale, scale).sum()))(q)
  kw, vw = from_cache(k8, scale, q.dtype), from_cache(v8, scale, q.dtype)
  want = jax.grad(lambda q: attend_xla(q, kw, vw, positions).sum())(q)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert float(jnp.abs(got).sum()) > 0


def test_a_tree_forward_gets_attend_xla_s_gradient_under_the_tree_mask():
  q, k, v, _ = inputs()
  t = tree([(0,), (1,)])
  mask = TreeMask(jnp.asarray([2, 5], jnp.int32), np.arange(t.size), t.ancestors)
  positions = mask.root_B[:, None] + jnp.asarray(t.depths)[None, :]
  kernel = with_xla_gradient(opaque)

  def loss(attention):
    return lambda q, k, v: attention(q, k, v, positions, tree=mask).sum()

  got = jax.jit(jax.grad(loss(kernel), (0, 1, 2)))(q, k, v)
  want = jax.grad(loss(attend_xla), (0, 1, 2))(q, k, v)
  for g, r in zip(got, want, strict=True):
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
