"""specdec.lab.mappings: the mapping count and budget, and dropping executables above it."""

import jax
import jax.numpy as jnp

from specdec.lab.mappings import map_budget, memory_maps, release_if_over


def test_executables_are_dropped_only_above_the_mapping_budget():
  f = jax.jit(lambda x: jnp.sin(x) + 1)
  f(jnp.ones(3))
  assert memory_maps() > 0 and map_budget() > 0
  assert not release_if_over(10**9) and f._cache_size() == 1  # under budget: kept
  assert release_if_over(1) and f._cache_size() == 0  # over: jax's caches cleared
  assert not release_if_over(0)  # no budget known: never
