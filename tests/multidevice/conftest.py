"""Tests on a fake 4-device CPU mesh. They run in a process of their own (tests/test_sharding.py
starts it with --xla_force_host_platform_device_count=4); the main run does not collect them."""

import jax
import pytest


@pytest.fixture(scope="session", autouse=True)
def four_devices():
  assert len(jax.devices()) == 4, "run through tests/test_sharding.py (a 4-device CPU process)"
