"""Acceptance of k drafted tokens against the target's distributions at the k+1 verify positions.

Modes (`Mode`):
  greedy  accept while draft == target argmax; the emitted token after the prefix is the argmax.
  onehot  the draft is treated as a point mass q = delta(d): accept d_i with probability p_i(d_i);
          on the first rejection sample from p_i with d_i zeroed and renormalised. Lossless for
          any drafter (it is Leviathan/Chen with a one-hot q); the default under sampling.
  fullq   Leviathan/Chen with the draft's own distribution q: accept with min(1, p/q); on the first
          rejection sample from norm(max(p - q, 0)).
  reject  every draft rejected: the same-shape baseline (verify width k+1, one token per step).
Under greedy sampling (temperature 0) every mode reduces to `greedy`. `reject` is also a run-time
flag (`accept(..., reject=)`, the decode state's `reject`), so the baseline runs the executable of
the mode it is compared with: `base_mode` names that mode.
In all modes, when all k drafts are accepted, the bonus token is drawn from p_k.

Trees (`accept_tree`): greedy takes the deepest path the target's argmax agrees with; onehot walks
the tree by multi-draft recursive rejection sampling (docs/design.md, "Trees").

Shapes (docs/design.md, "Shape letters"): B rows, J = k draft positions (a tree's drafted nodes),
T = k+1 verify positions, V vocabulary, n tree nodes, o child ranks.
"""

import typing
from typing import Literal

import jax
import jax.numpy as jnp

from specdec.ops.sampling import Sampling, probs, sample

Mode = Literal["greedy", "onehot", "fullq", "reject"]
MODES: tuple[Mode, ...] = typing.get_args(Mode)


def validate_mode(mode: str, s: Sampling) -> None:
  if mode not in MODES:
    raise ValueError(f"unknown acceptance mode {mode!r}; choose one of {', '.join(MODES)}")
  if mode == "greedy" and not s.greedy:
    raise ValueError("acceptance='greedy' needs temperature=0; use 'onehot' or 'fullq' to sample")


def base_mode(mode: Mode, s: Sampling) -> Mode:
  """The compiled mode a run of `mode` uses: `reject` runs as greedy or onehot with the flag set."""
  if mode != "reject":
    return mode
  return "greedy" if s.greedy else "onehot"


def accept(key, logits_BTV, draft_BJ, q_BJV, s: Sampling, mode: Mode, reject=False):
  """Returns (n_acc [B], out [B, k+1]): out[:, :n_acc] are the accepted drafts, out[:, n_acc] the
  corrected or bonus token; entries after n_acc are meaningless.

  logits_BTV: target logits at the T = k+1 verify positions; draft_BJ: the k drafts; q_BJV: the
  draft distributions (read by `fullq` only). reject (a bool, traced or not): every draft is
  rejected and the next token drawn from p_0, as mode `reject`.
  """
  B, T, V = logits_BTV.shape
  k = T - 1
  reject = jnp.asarray(reject) | (mode == "reject")
  mode = base_mode(mode, s)
  if s.greedy or mode == "greedy":
    target_BT = jnp.argmax(logits_BTV, -1).astype(jnp.int32)
    ok_BJ = draft_BJ == target_BT[:, :k]
    n_acc_B = jnp.sum(jnp.cumprod(ok_BJ, -1), -1).astype(jnp.int32)
    return jnp.where(reject, 0, n_acc_B), target_BT

  p_BTV = probs(logits_BTV, s)
  key_u, key_s = jax.random.split(key)
  b_B = jnp.arange(B)
  p_draft_BJ = jnp.take_along_axis(p_BTV[:, :k], draft_BJ[..., None], -1)[..., 0]
  u_BJ = jax.random.uniform(key_u, (B, k))
  if mode == "onehot":
    ok_BJ = u_BJ < p_draft_BJ
  else:
    q_draft_BJ = jnp.take_along_axis(q_BJV, draft_BJ[..., None], -1)[..., 0]
    ok_BJ = u_BJ * q_draft_BJ < p_draft_BJ
  n_acc_B = jnp.sum(jnp.cumprod(ok_BJ, -1), -1).astype(jnp.int32)
  n_acc_B = jnp.where(reject, 0, n_acc_B)

  # The distribution for the token after the accepted prefix: residual at a rejection, p_k if all
  # were accepted, p_0 itself where every draft is rejected by the flag (no draft was tested).
  p_BV = p_BTV[b_B, n_acc_B]
  rejected_B = (n_acc_B < k) & ~reject
  if k > 0:
    at = jnp.minimum(n_acc_B, k - 1)
    if mode == "onehot":
      d_BV = jax.nn.one_hot(draft_BJ[b_B, at], V, dtype=jnp.float32)
    else:
      d_BV = q_BJV[b_B, at].astype(jnp.float32)
    residual_BV = jnp.maximum(p_BV - d_BV, 0.0)
    mass_B1 = jnp.sum(residual_BV, -1, keepdims=True)
    # Zero residual mass only happens when p == q exactly, where a rejection has probability 0.
    residual_BV = jnp.where(mass_B1 > 0, residual_BV / jnp.maximum(mass_B1, 1e-30), p_BV)
    p_BV = jnp.where(rejected_B[:, None], residual_BV, p_BV)
  token_B = sample(key_s, p_BV)
  out_BT = jnp.concatenate([draft_BJ, jnp.zeros((B, 1), jnp.int32)], -1)
  out_BT = out_BT.at[b_B, n_acc_B].set(token_B)
  return n_acc_B, out_BT


def accept_tree(key, logits_BnV, draft_BJ, tree, s: Sampling, mode: Mode, reject=False):
  """Acceptance over a static draft tree (specdec/decoding/tree.py). Returns (n_acc [B],
  out [B, depth+1], path [B, depth+1]): the accepted path is path[:, :n_acc+1] (node 0 the root),
  out[:, :n_acc] its drafted tokens and out[:, n_acc] the target's token after it; entries past
  n_acc are meaningless.

  logits_BnV: target logits at the tree's n nodes (root first); draft_BJ: the J = n - 1 drafted
  nodes' tokens in node order, NO_TOKEN (negative) where the drafter left a node unfilled, which
  is never accepted. Greedy: a node is accepted when it and each of its ancestors equal the
  target's argmax at their parent, and the deepest accepted node wins (the first in node order
  among equals). onehot: `_walk_tree`. reject: only the root is accepted and the next token comes
  from p at the root (the same-shape baseline).
  """
  reject = jnp.asarray(reject) | (mode == "reject")
  mode = base_mode(mode, s)
  B = logits_BnV.shape[0]
  b_B = jnp.arange(B)
  depths_n = jnp.asarray(tree.depths)
  if s.greedy or mode == "greedy":
    target_Bn = jnp.argmax(logits_BnV, -1).astype(jnp.int32)
    ok_BJ = draft_BJ == target_Bn[:, tree.parents[1:]]
    ok_Bn = jnp.concatenate([jnp.ones((B, 1), bool), ok_BJ & ~reject], 1)
    acc_Bn = jnp.all(ok_Bn[:, None, :] | ~jnp.asarray(tree.ancestors)[None], -1)
    best_B = jnp.argmax(jnp.where(acc_Bn, depths_n, -1), -1)
    token_B = target_Bn[b_B, best_B]
  elif mode == "onehot":
    best_B, token_B = _walk_tree(key, probs(logits_BnV, s), draft_BJ, tree, reject)
  else:
    raise ValueError(f"tree acceptance supports greedy and onehot, got mode {mode!r}")
  n_acc_B = depths_n[best_B]
  path_BT = jnp.asarray(tree.path_to)[best_B]
  tokens_Bn = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), draft_BJ], 1)
  out_BT = jnp.take_along_axis(tokens_Bn, jnp.roll(path_BT, -1, 1), 1)
  return n_acc_B, out_BT.at[b_B, n_acc_B].set(token_B), path_BT


def _walk_tree(key, p_BnV, draft_BJ, tree, reject):
  """Multi-draft recursive rejection sampling with one-hot drafts (SpecInfer's rule for a
  deterministic or independently drawn draft; docs/design.md, "Trees"): at the current node try
  its children in rank order, accepting child c with probability p(c) under the current p; each
  rejection sets p <- norm(p with c's token zeroed). An accepted child becomes the current node
  with its own target p; when every child is rejected (or there are none) the next token is
  drawn from the current p. Returns (the deepest accepted node [B], that token [B])."""
  B, n, V = p_BnV.shape
  b_B = jnp.arange(B)
  width = tree.children.shape[1]
  children_no = jnp.asarray(tree.children)
  tokens_Bn = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), draft_BJ], 1)
  key_u, key_s = jax.random.split(key)
  node_B = jnp.zeros((B,), jnp.int32)
  p_BV = p_BnV[:, 0]
  walking_B = ~jnp.broadcast_to(reject, (B,))
  for d in range(tree.depth):
    moved_B = jnp.zeros((B,), bool)
    next_B = node_B
    for r in range(width):
      child_B = children_no[node_B, r]
      token_B = tokens_Bn[b_B, jnp.maximum(child_B, 0)]
      tried_B = walking_B & ~moved_B & (child_B >= 0) & (token_B >= 0)  # NO_TOKEN: not drafted
      token_B = jnp.maximum(token_B, 0)
      u_B = jax.random.uniform(jax.random.fold_in(key_u, d * width + r), (B,))
      ok_B = tried_B & (u_B < p_BV[b_B, token_B])
      next_B = jnp.where(ok_B, child_B, next_B)
      moved_B |= ok_B
      p_BV = jnp.where((tried_B & ~ok_B)[:, None], _residual(p_BV, token_B), p_BV)
    node_B = next_B
    p_BV = jnp.where(moved_B[:, None], p_BnV[b_B, node_B], p_BV)
    walking_B &= moved_B
  return node_B, sample(key_s, p_BV)


def _residual(p_BV, token_B):
  """norm(max(p - onehot(token), 0)): p with the rejected token's mass removed, renormalised."""
  residual_BV = p_BV.at[jnp.arange(p_BV.shape[0]), token_B].set(0.0)
  mass_B1 = jnp.sum(residual_BV, -1, keepdims=True)
  # Zero mass only if p was a point mass on the token, which is then accepted surely.
  return jnp.where(mass_B1 > 0, residual_BV / jnp.maximum(mass_B1, 1e-30), p_BV)
