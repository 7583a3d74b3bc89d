"""The gated delta rule: chunked == recurrent, padding is a no-op, states are selectable."""

import jax
import jax.numpy as jnp
import numpy as np

from specdec.ops import gdn


def _inputs(seed, B=2, T=37, Y=3, H=8, U=6):
  ks = jax.random.split(jax.random.key(seed), 6)
  q = gdn.l2norm(jax.random.normal(ks[0], (B, T, Y, H))) * H**-0.5
  k = gdn.l2norm(jax.random.normal(ks[1], (B, T, Y, H)))
  v = jax.random.normal(ks[2], (B, T, Y, U))
  g = -jax.nn.softplus(jax.random.normal(ks[3], (B, T, Y)))
  beta = jax.nn.sigmoid(jax.random.normal(ks[4], (B, T, Y)))
  s0 = 0.3 * jax.random.normal(ks[5], (B, Y, H, U))
  return q, k, v, g, beta, s0


def _naive(q, k, v, g, beta, s):
  """The rule as written, one token at a time in numpy float64."""
  q, k, v, g, beta, s = (np.asarray(a, np.float64) for a in (q, k, v, g, beta, s))
  outs = []
  for t in range(q.shape[1]):
    s = s * np.exp(g[:, t])[..., None, None]
    pred = np.einsum("byhu,byh->byu", s, k[:, t])
    s = s + k[:, t][..., :, None] * ((v[:, t] - pred) * beta[:, t][..., None])[..., None, :]
    outs.append(np.einsum("byhu,byh->byu", s, q[:, t]))
  return np.stack(outs, 1), s


def test_per_token_and_chunked_match_the_rule():
  args = _inputs(0, T=17)  # a verify window: k + 1 = 17
  o_ref, _ = _naive(*args)
  o_p, s_p = gdn.per_token(*args)
  np.testing.assert_allclose(o_p, o_ref, atol=1e-5)
  for t in (0, 5, 16):  # the state after t + 1 tokens
    np.testing.assert_allclose(
      s_p[:, t], _naive(*(a[:, : t + 1] for a in args[:5]), args[5])[1], atol=1e-5
    )
  args = _inputs(0)
  o_ref, s_ref = _naive(*args)
  for chunk in (1, 8, 64):  # several chunks with a padded tail, and one chunk
    o_c, s_c = gdn.chunked(*args, chunk=chunk)
    np.testing.assert_allclose(o_c, o_ref, atol=1e-4, err_msg=f"chunk {chunk}")
    np.testing.assert_allclose(s_c, s_ref, atol=1e-4, err_msg=f"chunk {chunk}")


def test_masked_tokens_leave_the_state_alone():
  q, k, v, g, beta, s0 = _inputs(1)
  n = np.array([5, 30])
  live = (np.arange(q.shape[1])[None] < n[:, None])[..., None]
  _, s = gdn.chunked(q, k, v, jnp.where(live, g, 0), jnp.where(live, beta, 0), s0, chunk=8)
  _, states = gdn.per_token(q, k, v, g, beta, s0)
  for b in range(2):
    np.testing.assert_allclose(s[b], states[b, n[b] - 1], atol=1e-4)


def test_conv_window_gives_the_state_after_n_tokens():
  ks = jax.random.split(jax.random.key(2), 3)
  Z, X = 4, 5
  x = jax.random.normal(ks[0], (2, 9, X))
  state = jax.random.normal(ks[1], (2, Z - 1, X))
  kernel = jax.random.normal(ks[2], (X, Z))
  out, win = gdn.causal_conv(x, state, kernel)
  full = np.concatenate([np.asarray(state), np.asarray(x)], 1)
  want = np.stack([(full[:, t : t + Z] * np.asarray(kernel).T).sum(1) for t in range(9)], 1)
  np.testing.assert_allclose(out, jax.nn.silu(want), atol=1e-5)
  n = jnp.array([0, 6])
  picked = gdn.conv_state_at(win, n, Z)
  np.testing.assert_array_equal(picked[0], state[0])
  np.testing.assert_array_equal(picked[1], x[1, 3:6])
  # Feeding the rest of x from the picked state continues the same conv.
  rest, _ = gdn.causal_conv(x[1:, 6:], picked[1:], kernel)
  np.testing.assert_allclose(rest[0], out[1, 6:], atol=1e-6)
