"""The Gated DeltaNet recurrence (Yang et al., gated delta rule) and its short causal conv.

Per value head the state S [H, U] maps keys to values; each token decays it, writes the part of v
it does not yet predict, and reads it with q:

  S <- exp(g) S;   S <- S + beta k (v - S^T k)^T;   o = S^T q

`per_token` returns the output and the state after every token, all tokens as one chunk (verify:
the commit picks the state at the accepted count). `chunked` is the same map in chunks of `chunk`
tokens with only the last state (prefill). In both a unit-lower-triangular solve turns a chunk's
updates into matmuls. A token with g = 0 and beta = 0 leaves the state as it was, which is how
callers mask padding.

Shapes: B rows, T tokens, Y value heads, H key head dim, U value head dim, Z conv taps, X conv
channels, w conv window rows. The state math runs in float32 at full matmul precision.
"""

import jax
import jax.numpy as jnp

HI = jax.lax.Precision.HIGHEST


def l2norm(x, eps: float = 1e-6):
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + eps)


def causal_conv(x_BTX, conv_BwX, kernel_XZ):
  """silu of the depthwise causal conv over [state, x]: (out [B, T, X], the window [B, w, X]).

  conv_BwX holds the Z - 1 inputs before this forward; the returned window is them followed by
  x (w = T + Z - 1 rows, in the state's dtype), so the state after n of the T tokens is
  window[n : n + Z - 1].
  """
  T, Z = x_BTX.shape[1], kernel_XZ.shape[1]
  win_BwX = jnp.concatenate([conv_BwX, x_BTX.astype(conv_BwX.dtype)], 1)
  x_BwX, kernel_XZ = win_BwX.astype(x_BTX.dtype), kernel_XZ.astype(x_BTX.dtype)
  out_BTX = sum(x_BwX[:, z : z + T] * kernel_XZ[:, z] for z in range(Z))
  return jax.nn.silu(out_BTX), win_BwX


def conv_state_at(win_BwX, n_B, taps: int):
  """The conv state after n_B[b] tokens of a forward: rows n .. n + taps - 2 of its window."""
  return jax.vmap(lambda w, n: jax.lax.dynamic_slice_in_dim(w, n, taps - 1, 0))(win_BwX, n_B)


def _intra(q, k, v, g, beta):
  """One chunk's terms, tokens on the second-to-last axis [..., L, *]: the cumulative log-decay
  c [..., L], decay [..., L, L] (exp(c_i - c_j) for j <= i, else 0), the solved u [..., L, U] and
  w [..., L, H], and q k^T * decay [..., L, L]."""
  L, U = k.shape[-2], v.shape[-1]
  c = jnp.cumsum(g, -1)
  lower = jnp.tril(jnp.ones((L, L), bool))
  decay = jnp.exp(jnp.where(lower, c[..., :, None] - c[..., None, :], -jnp.inf))
  kk = jnp.einsum("...iH,...jH->...ij", k, k, precision=HI)
  a = jnp.where(jnp.tril(lower, -1), beta[..., :, None] * kk * decay, 0) + jnp.eye(L)
  rhs = jnp.concatenate([beta[..., None] * v, (beta * jnp.exp(c))[..., None] * k], -1)
  uw = jax.lax.linalg.triangular_solve(a, rhs, left_side=True, lower=True, unit_diagonal=True)
  qk = jnp.einsum("...iH,...jH->...ij", q, k, precision=HI) * decay
  return c, decay, uw[..., :U], uw[..., U:], qk


def per_token(q_BTYH, k_BTYH, v_BTYU, g_BTY, beta_BTY, s_BYHU):
  """All T tokens as one chunk: (o [B, T, Y, U], the state after each token [B, T, Y, H, U]).

  The state after token t is exp(c_t) S + sum_{j <= t} exp(c_t - c_j) k_j v'_j^T, every t at once
  (verify: T = k + 1 is small, and no step waits on the one before).
  """
  heads_first = lambda a: jnp.moveaxis(a.astype(jnp.float32), 1, 2)  # noqa: E731
  q, k, v = heads_first(q_BTYH), heads_first(k_BTYH), heads_first(v_BTYU)
  g, beta = (jnp.moveaxis(a.astype(jnp.float32), 1, 2) for a in (g_BTY, beta_BTY))
  s = s_BYHU.astype(jnp.float32)
  c, decay, u, w, qk = _intra(q, k, v, g, beta)  # [B, Y, T, ...]
  v_new = u - jnp.einsum("BYLH,BYHU->BYLU", w, s, precision=HI)
  o = jnp.einsum("BYLH,BYHU->BYLU", q * jnp.exp(c)[..., None], s, precision=HI)
  o = o + jnp.einsum("BYij,BYjU->BYiU", qk, v_new, precision=HI)
  kd = jnp.einsum("BYij,BYjH->BYijH", decay, k)
  states = jnp.exp(c)[..., None, None] * s[:, :, None]
  states = states + jnp.einsum("BYijH,BYjU->BYiHU", kd, v_new, precision=HI)
  return jnp.moveaxis(o, 2, 1), jnp.moveaxis(states, 2, 1)


def chunked(q_BTYH, k_BTYH, v_BTYU, g_BTY, beta_BTY, s_BYHU, chunk: int = 64):
  """The same map in chunks: (o [B, T, Y, U], the state after the last token [B, Y, H, U]).

  Within a chunk with cumulative log-decay c_i, the delta-rule updates solve
  (I + L) [u | w] = [beta v | beta exp(c) k], L the strictly lower part of
  beta_i k_i.k_j exp(c_i - c_j); then v' = u - w S, o = exp(c) q S + (q k^T * decay) v' and
  S <- exp(c_last) S + (exp(c_last - c) k)^T v'.
  """
  B, T, Y, H = k_BTYH.shape
  U = v_BTYU.shape[-1]
  L = min(chunk, T)
  pad = -T % L
  f32 = lambda a: jnp.pad(  # noqa: E731
    a.astype(jnp.float32), [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2)
  )
  q, k, v, g, beta = (f32(a) for a in (q_BTYH, k_BTYH, v_BTYU, g_BTY, beta_BTY))
  n = (T + pad) // L
  # [n, B, Y, L, ...]: chunks first for the scan, heads before the chunk's tokens.
  split = lambda a: jnp.moveaxis(a.reshape(B, n, L, Y, -1), (1, 3), (0, 2))  # noqa: E731
  q, k, v = split(q), split(k), split(v)
  g, beta = split(g)[..., 0], split(beta)[..., 0]
  c, _, u, w, qk = _intra(q, k, v, g, beta)
  q_dec = q * jnp.exp(c)[..., None]
  k_dec = k * jnp.exp(c[..., -1:] - c)[..., None]

  def one(s_BYHU, xs):
    u, w, qk, q_dec, k_dec, c_last = xs
    v_new = u - jnp.einsum("BYLH,BYHU->BYLU", w, s_BYHU, precision=HI)
    o = jnp.einsum("BYLH,BYHU->BYLU", q_dec, s_BYHU, precision=HI)
    o = o + jnp.einsum("BYij,BYjU->BYiU", qk, v_new, precision=HI)
    s_BYHU = s_BYHU * jnp.exp(c_last)[..., None, None]
    s_BYHU = s_BYHU + jnp.einsum("BYLH,BYLU->BYHU", k_dec, v_new, precision=HI)
    return s_BYHU, o

  s, o = jax.lax.scan(one, s_BYHU.astype(jnp.float32), (u, w, qk, q_dec, k_dec, c[..., -1]))
  o_BTYU = jnp.moveaxis(o, (0, 2), (1, 3)).reshape(B, n * L, Y, U)[:, :T]
  return o_BTYU, s
