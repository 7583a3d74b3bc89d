"""tests/conftest.py: the XLA optimization level tests compile at (its guard against running out
of memory mappings: tests/lab/test_mappings.py)."""

import jax
import pytest


def test_tests_compile_with_the_cheapest_settings():
  assert jax.config.values["jax_disable_most_optimizations"]


@pytest.mark.optimized
def test_a_test_marked_optimized_compiles_with_the_full_optimizations():
  assert not jax.config.values["jax_disable_most_optimizations"]
