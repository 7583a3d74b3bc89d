"""Draft tokens from one block's logits: per-position argmax (DFlash) or DFlash2's selector walk.

Under greedy sampling the draft is the argmax (of the logits, or of the selector's edge row) and no
q is returned. Under full-q acceptance the draft is sampled and q is the distribution it was drawn
from: the transformed logits (DFlash), or the transformed edge row over the top-k candidates,
zero elsewhere (DFlash2). A block's positions are drawn independently given the context (DFlash)
or given the previous choice (DFlash2): both are valid conditionals for Leviathan acceptance.
"""

import jax
import jax.numpy as jnp

from specdec.ops import sampling as sampling_lib


def pick(logits_BPV, sampling, key):
  """Independent per-position choice: (draft [B, P], q [B, P, V] or None)."""
  if sampling.greedy:
    return jnp.argmax(logits_BPV, -1).astype(jnp.int32), None
  q_BPV = sampling_lib.probs(logits_BPV, sampling)
  return sampling_lib.sample(key, q_BPV), q_BPV


def candidates(logits_BPV, top_k: int):
  """The selector's candidate lists: (unary logits [B, P, c], token ids [B, P, c]), best first."""
  unary_BPc, cand_BPc = jax.lax.top_k(logits_BPV.astype(jnp.float32), top_k)
  return unary_BPc, cand_BPc.astype(jnp.int32)


def predecessors(anchor_B, cand_BPc):
  """Predecessor ids per position and row: the anchor for the first drafted position (every row
  the same), the previous position's candidates after that."""
  B, P, c = cand_BPc.shape
  first_B1c = jnp.broadcast_to(anchor_B[:, None, None], (B, 1, c))
  return jnp.concatenate([first_B1c, cand_BPc[:, :-1]], 1)


def walk(edge_BPpc, cand_BPc, vocab: int, sampling, key):
  """Greedy (or sampled) path from the anchor: position t takes the best successor in the edge row
  of the candidate chosen at t-1. Position 0's rows all hold the anchor, so row 0 is its row."""
  B, P, c, _ = edge_BPpc.shape
  b_B = jnp.arange(B)

  def one(prev_B, xs):
    edge_Bpc, cand_Bc, key_t = xs
    row_Bc = edge_Bpc[b_B, prev_B]
    if sampling.greedy:
      idx_B = jnp.argmax(row_Bc, -1).astype(jnp.int32)
      q_BV = jnp.zeros((B, 0), jnp.float32)
    else:
      q_Bc = sampling_lib.probs(row_Bc, sampling)
      idx_B = sampling_lib.sample(key_t, q_Bc)
      q_BV = jnp.zeros((B, vocab), jnp.float32).at[b_B[:, None], cand_Bc].add(q_Bc)
    return idx_B, (cand_Bc[b_B, idx_B], q_BV)

  xs = (jnp.swapaxes(edge_BPpc, 0, 1), jnp.swapaxes(cand_BPc, 0, 1), jax.random.split(key, P))
  _, (d_PB, q_PBV) = jax.lax.scan(one, jnp.zeros((B,), jnp.int32), xs)
  return d_PB.T, None if sampling.greedy else jnp.swapaxes(q_PBV, 0, 1)
