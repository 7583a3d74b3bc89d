"""Counting what XLA builds: the compile log line of `generate` and the sweep's `compiles` field."""

import threading

import jax

EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT
HIT = "/jax/compilation_cache/cache_hits"  # jax._src.compiler: a load from the persistent cache


class CompileCounter:
  """Counts the XLA executables built while active in this thread, and their seconds: a backend
  compile or a load from the persistent compilation cache (jax times both as one event; `hits`
  counts the loads); a call that finds its executable in memory records nothing. Eager ops count
  too, once per new shape. jax fires the events in the compiling thread, so counters active in
  other threads (a sweep compiling ahead on several) count only their own."""

  def __init__(self):
    self.count, self.hits, self.seconds = 0, 0, 0.0
    self._thread = threading.get_ident()

  @property
  def compiled(self) -> int:
    """Executables XLA compiled (not found in the persistent cache)."""
    return self.count - self.hits

  def _mine(self) -> bool:
    return threading.get_ident() == self._thread

  def _duration(self, event: str, duration: float, **_) -> None:
    if event == EVENT and self._mine():
      self.count += 1
      self.seconds += duration

  def _event(self, event: str, **_) -> None:
    if event == HIT and self._mine():
      self.hits += 1

  def __enter__(self) -> "CompileCounter":
    self._thread = threading.get_ident()
    jax.monitoring.register_event_duration_secs_listener(self._duration)
    jax.monitoring.register_event_listener(self._event)
    return self

  def __exit__(self, *exc) -> None:
    jax.monitoring.unregister_event_duration_listener(self._duration)
    jax.monitoring.unregister_event_listener(self._event)
