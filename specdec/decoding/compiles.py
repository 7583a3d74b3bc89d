"""Counting what XLA builds: the compile log line of `generate` and the sweep's `compiles` field."""

import jax

EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT


class CompileCounter:
  """Counts the XLA executables built while active, and their seconds: a backend compile or a load
  from the persistent compilation cache (jax times both as one event); a call that finds its
  executable in memory records nothing. Eager ops count too, once per new shape."""

  def __init__(self):
    self.count, self.seconds = 0, 0.0

  def _listen(self, event: str, duration: float, **_) -> None:
    if event == EVENT:
      self.count += 1
      self.seconds += duration

  def __enter__(self) -> "CompileCounter":
    jax.monitoring.register_event_duration_secs_listener(self._listen)
    return self

  def __exit__(self, *exc) -> None:
    jax.monitoring.unregister_event_duration_listener(self._listen)
