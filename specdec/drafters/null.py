"""No drafting: the autoregressive baseline (k = 0), or the same-shape baseline with k > 0 under
acceptance='reject' (verify width k+1, every draft rejected)."""

import dataclasses

import jax.numpy as jnp

from specdec.drafters.base import Drafter


# Compares by value, so equal drafters share compiled steps across generate calls.
@dataclasses.dataclass(frozen=True)
class Null(Drafter):
  name = "null"

  def propose(self, params, state, ctx, k, sampling, key):
    return jnp.zeros((ctx.lengths_B.shape[0], k), jnp.int32), None, state


def null() -> Null:
  return Null()
