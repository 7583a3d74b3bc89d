"""Routed experts: top-e routing and the grouped SwiGLU matmul, two ways.

  "ragged"  tokens sorted by expert, then `jax.lax.ragged_dot` over the groups: each expert's
            weights are read once for all the tokens routed to it (prefill, large batches)
  "gather"  each (token, choice) gathers its expert's weights and runs its own einsum: only the
            routed experts are read, with no sort (decode and verify, M x e small)

None picks "gather" while M x e <= I (no expert can be read twice over), on a GPU while
M x e <= I / 2, and "ragged" above: the crossovers measured in docs/benchmarks.md.
Shapes: M token rows, D model, F expert width, I experts, e chosen per token.
"""

import jax
import jax.numpy as jnp

IMPLEMENTATIONS = (None, "ragged", "gather")


def route(logits_MI, top: int, normalize: bool):
  """softmax over the experts in float32, the top `top`, renormalized over them if asked:
  (weights [M, e] in the logits' dtype, expert ids [M, e])."""
  p_MI = jax.nn.softmax(logits_MI.astype(jnp.float32), -1)
  w_Me, ids_Me = jax.lax.top_k(p_MI, top)
  if normalize:
    w_Me = w_Me / jnp.sum(w_Me, -1, keepdims=True)
  return w_Me.astype(logits_MI.dtype), ids_Me


def experts(x_MD, w_Me, ids_Me, gate_IDF, up_IDF, down_IFD, implementation=None):
  """sum_e w[m, e] * down(silu(x gate) * (x up)) of expert ids[m, e]: [M, D] in x's dtype."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"unknown MoE implementation {implementation!r}; expected {IMPLEMENTATIONS}")
  M, e = ids_Me.shape
  if implementation is None:
    gather_max = gate_IDF.shape[0] // (2 if jax.default_backend() == "gpu" else 1)
    implementation = "gather" if M * e <= gather_max else "ragged"
  if implementation == "gather":
    return _gather(x_MD, w_Me, ids_Me, gate_IDF, up_IDF, down_IFD)
  return _ragged(x_MD, w_Me, ids_Me, gate_IDF, up_IDF, down_IFD)


def _gather(x_MD, w_Me, ids_Me, gate_IDF, up_IDF, down_IFD):
  dt = x_MD.dtype
  gate_MeDF, up_MeDF, down_MeFD = (a[ids_Me].astype(dt) for a in (gate_IDF, up_IDF, down_IFD))
  h_MeF = jax.nn.silu(jnp.einsum("MD,MeDF->MeF", x_MD, gate_MeDF))
  h_MeF = h_MeF * jnp.einsum("MD,MeDF->MeF", x_MD, up_MeDF)
  y_MeD = jnp.einsum("MeF,MeFD->MeD", h_MeF, down_MeFD)
  return jnp.einsum("MeD,Me->MD", y_MeD, w_Me.astype(dt))


def _ragged(x_MD, w_Me, ids_Me, gate_IDF, up_IDF, down_IFD):
  dt = x_MD.dtype
  M, e = ids_Me.shape
  flat_X = ids_Me.reshape(-1)  # X = M x e (token, choice) rows, flattened
  order_X = jnp.argsort(flat_X, stable=True)
  token_X = order_X // e
  sizes_I = jnp.bincount(flat_X, length=gate_IDF.shape[0]).astype(jnp.int32)
  xs_XD = x_MD[token_X]
  g_XF = jax.lax.ragged_dot(xs_XD, gate_IDF.astype(dt), sizes_I)
  u_XF = jax.lax.ragged_dot(xs_XD, up_IDF.astype(dt), sizes_I)
  y_XD = jax.lax.ragged_dot(jax.nn.silu(g_XF) * u_XF, down_IFD.astype(dt), sizes_I)
  y_XD = y_XD * w_Me.reshape(-1)[order_X][:, None].astype(dt)
  return jnp.zeros_like(x_MD).at[token_X].add(y_XD)
