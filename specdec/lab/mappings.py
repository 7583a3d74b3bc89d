"""The process's memory mappings against the kernel's limit. XLA:CPU keeps ~300 mappings for each
executable it has compiled (a zoo decode chunk, a 2-layer test model's generate ~230), and a
process past vm.max_map_count (65530 by default) segfaults in its next compile: a CPU sweep of
~200 executables gets there. A long sweep and the test suite drop jax's compiled executables
when they hold more than a budget of mappings; what is needed again compiles again."""

import functools
import gc


def memory_maps() -> int:
  """This process's memory mappings (0 where /proc is absent)."""
  try:
    with open("/proc/self/maps", "rb") as f:
      return f.read().count(b"\n")
  except OSError:
    return 0


@functools.cache
def map_budget() -> int:
  """60% of the kernel's per-process mapping limit (0, no budget, where unreadable)."""
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      return int(f.read()) * 3 // 5
  except (OSError, ValueError):
    return 0


def release() -> None:
  """Clears jax's caches, and so its compiled executables' mappings (later calls compile
  again)."""
  import jax

  jax.clear_caches()
  gc.collect()


def release_if_over(budget: int) -> bool:
  """`release()` if this process holds more than `budget` mappings (0: no budget); returns
  whether it did."""
  if not budget or memory_maps() <= budget:
    return False
  release()
  return True
