"""Acceptance of k drafted tokens against the target's k+1 verify distributions.

Modes:
  greedy  accept while draft == target argmax; the emitted token after the prefix is the argmax.
  onehot  the draft is treated as a point mass q = delta(d): accept d_i with probability p_i(d_i);
          on the first rejection sample from p_i with d_i zeroed and renormalised. Lossless for
          any drafter (it is Leviathan/Chen with a one-hot q); the default under sampling.
  fullq   Leviathan/Chen with the draft's own distribution q: accept with min(1, p/q); on the first
          rejection sample from norm(max(p - q, 0)).
  reject  every draft rejected: the same-shape baseline (verify width k+1, one token per step).
Under greedy sampling (temperature 0) every mode reduces to `greedy`.
In all modes, when all k drafts are accepted, the bonus token is drawn from p_k.
"""

import jax
import jax.numpy as jnp

from specdec.ops.sampling import Sampling, probs, sample

MODES = ("greedy", "onehot", "fullq", "reject")


def validate_mode(mode: str, s: Sampling) -> None:
  if mode not in MODES:
    raise ValueError(f"unknown acceptance mode {mode!r}; choose one of {', '.join(MODES)}")
  if mode == "greedy" and not s.greedy:
    raise ValueError("acceptance='greedy' needs temperature=0; use 'onehot' or 'fullq' to sample")


def accept(key, logits_BKV, draft_BK, q_BKV, s: Sampling, mode: str):
  """Returns (n_acc [B], out [B, k+1]): out[:, :n_acc] are the accepted drafts, out[:, n_acc] the
  corrected or bonus token; entries after n_acc are meaningless.

  logits_BKV: target logits at the k+1 verify positions ([B, k+1, V]).
  """
  B, K1, V = logits_BKV.shape
  k = K1 - 1
  if s.greedy or mode == "greedy":
    target_BK1 = jnp.argmax(logits_BKV, -1).astype(jnp.int32)
    if mode == "reject":
      return jnp.zeros((B,), jnp.int32), target_BK1
    ok_BK = draft_BK == target_BK1[:, :k]
    n_acc_B = jnp.sum(jnp.cumprod(ok_BK, -1), -1).astype(jnp.int32)
    return n_acc_B, target_BK1

  p_BK1V = probs(logits_BKV, s)
  key_u, key_s = jax.random.split(key)
  b_B = jnp.arange(B)
  if mode == "reject":
    return jnp.zeros((B,), jnp.int32), jnp.broadcast_to(
      sample(key_s, p_BK1V[:, 0])[:, None], (B, K1)
    )

  p_draft_BK = jnp.take_along_axis(p_BK1V[:, :k], draft_BK[..., None], -1)[..., 0]
  u_BK = jax.random.uniform(key_u, (B, k))
  if mode == "onehot":
    ok_BK = u_BK < p_draft_BK
  else:
    q_draft_BK = jnp.take_along_axis(q_BKV, draft_BK[..., None], -1)[..., 0]
    ok_BK = u_BK * q_draft_BK < p_draft_BK
  n_acc_B = jnp.sum(jnp.cumprod(ok_BK, -1), -1).astype(jnp.int32)

  # The distribution for the token after the accepted prefix: residual at a rejection, p_k if all
  # were accepted.
  p_V = p_BK1V[b_B, n_acc_B]
  rejected_B = n_acc_B < k
  if k > 0:
    at = jnp.minimum(n_acc_B, k - 1)
    if mode == "onehot":
      d_V = jax.nn.one_hot(draft_BK[b_B, at], V, dtype=jnp.float32)
    else:
      d_V = q_BKV[b_B, at].astype(jnp.float32)
    residual_V = jnp.maximum(p_V - d_V, 0.0)
    mass_B = jnp.sum(residual_V, -1, keepdims=True)
    # Zero residual mass only happens when p == q exactly, where a rejection has probability 0.
    residual_V = jnp.where(mass_B > 0, residual_V / jnp.maximum(mass_B, 1e-30), p_V)
    p_V = jnp.where(rejected_B[:, None], residual_V, p_V)
  token_B = sample(key_s, p_V)
  out_BK1 = jnp.concatenate([draft_BK, jnp.zeros((B, 1), jnp.int32)], -1)
  out_BK1 = out_BK1.at[b_B, n_acc_B].set(token_B)
  return n_acc_B, out_BK1
