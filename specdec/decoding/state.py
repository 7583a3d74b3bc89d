"""The decode state: one typed pytree with static shapes, donated to every chunk.

Slots at or past a row's `lengths` are stale, in `tokens` and in every KV cache (the target's in
`cache`, a drafter's in `draft`): rollback of rejected drafts is a shorter length, never a copy.
Shapes: B rows, S slots, k draft length (docs/design.md, "The decode state").
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec import metrics
from specdec.models.transformer import KVCache


def ctx_bucket(lengths_B):
  """The histogram's context bucket, by the rule `specdec.metrics` reads it back with."""
  return metrics.ctx_bucket(lengths_B, metrics.DEFAULT_CTX_EDGES, xp=jnp)


@flax.struct.dataclass
class DecodeState:
  tokens: jax.Array  # [B, S] int32; slots >= lengths are stale
  lengths: jax.Array  # [B] committed tokens (prompt + generated)
  prompt_lengths: jax.Array  # [B]
  max_new: jax.Array  # [B] generation budget per row
  cache: KVCache  # target KV
  draft: Any  # the drafter's own state
  key: jax.Array
  done: jax.Array  # [B] bool
  reject: jax.Array  # [] bool: every draft rejected (the same-shape baseline), a run-time choice
  steps: jax.Array  # [B] target forwards after prefill
  proposed: jax.Array  # [B]
  accepted: jax.Array  # [B]
  accept_hist: jax.Array  # [B, n_buckets, k+1]: steps by accepted count and context bucket
  censored_hist: jax.Array  # [B, n_buckets, k+1]: those of them whose emission a cut shortened
  emitted_by_bucket: jax.Array  # [B, n_buckets]: tokens the steps emitted (metrics: tau)
  budget: Any = None  # k="auto": the estimator and tier counts (budget.BudgetState); None: fixed k

  @property
  def generated(self):
    return self.lengths - self.prompt_lengths


def counters(B: int, k: int) -> dict:
  """The state's counters at zero, as host arrays (no executable builds them); each its own
  buffer, since the state is donated and a buffer cannot be donated twice."""
  n = metrics.n_ctx_buckets()
  return dict(
    steps=np.zeros((B,), np.int32),
    proposed=np.zeros((B,), np.int32),
    accepted=np.zeros((B,), np.int32),
    accept_hist=np.zeros((B, n, k + 1), np.int32),
    censored_hist=np.zeros((B, n, k + 1), np.int32),
    emitted_by_bucket=np.zeros((B, n), np.int32),
  )
