"""tests/conftest.py: the guard against running out of memory mappings, and the XLA optimization
level tests compile at."""

import jax
import jax.numpy as jnp
import pytest

from tests.conftest import map_budget, memory_maps, release_if_over


def test_executables_are_dropped_only_above_the_mapping_budget():
  f = jax.jit(lambda x: jnp.sin(x) + 1)
  f(jnp.ones(3))
  assert memory_maps() > 0 and map_budget() > 0
  assert not release_if_over(10**9) and f._cache_size() == 1  # under budget: kept
  assert release_if_over(1) and f._cache_size() == 0  # over: jax's caches cleared
  assert not release_if_over(0)  # no budget known: never


def test_tests_compile_with_the_cheapest_settings():
  assert jax.config.values["jax_disable_most_optimizations"]


@pytest.mark.optimized
def test_a_test_marked_optimized_compiles_with_the_full_optimizations():
  assert not jax.config.values["jax_disable_most_optimizations"]
