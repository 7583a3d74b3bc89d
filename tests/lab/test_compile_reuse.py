"""Compile reuse: a sweep builds each executable once and reuses it in every later cell and leg
with the same static shapes; each row counts what its (cell, leg) built."""

import dataclasses
import os
import re

import jax
import numpy as np

from specdec.decoding.compiles import CompileCounter
from specdec.lab import driver, mappings, results
from tests.lab.test_sweep import small_config


def test_counter_counts_builds_not_calls():
  f = jax.jit(lambda x: x * 3 + 1)
  x7, y7, x8 = np.ones(7, np.float32), np.zeros(7, np.float32), np.ones(8, np.float32)
  with CompileCounter() as first:
    f(x7)
  with CompileCounter() as same_shape:
    f(y7)
  with CompileCounter() as new_shape:
    f(x8)
  assert (first.count, same_shape.count, new_shape.count) == (1, 0, 1)
  assert first.seconds > 0 and same_shape.seconds == 0


def test_a_counter_counts_its_own_thread_only():
  import threading

  f = jax.jit(lambda x: x - 2)
  gate, counts = threading.Barrier(2), {}

  def build(n):
    with CompileCounter() as c:
      gate.wait()  # both counters listen while both threads compile
      f(np.ones(n + 20, np.float32))
      gate.wait()
    counts[n] = c.count

  threads = [threading.Thread(target=build, args=(n,)) for n in (1, 2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert counts == {1: 1, 2: 1}


def test_sweep_reuses_executables_unless_a_static_shape_changes(tmp_path):
  jax.clear_caches()  # leg 0 builds its own executables, whatever ran before in this process
  # prompt_tokens=400 extends the prompts (264 and 352 tokens) within the same 512 bucket: new
  # prompt text, same static shapes. k is static (StepConfig): k=3 needs its own step.
  cfg = small_config(ks=(1, 3), prompt_tokens=(0, 400))
  driver.run(cfg, str(tmp_path), progress=False, compile_workers=0)  # each cell compiles its own
  rows = results.load_rows(os.path.join(tmp_path, results.RESULTS_NAME))
  by = {(r["method"], r["k"], r["prompt_tokens"], r["leg"]): r for r in rows}
  assert len(by) == 12
  assert by["ngram", 1, 400, 0]["extra"]["prompt_lengths"] == [400, 400]
  assert by["ngram", 1, 0, 0]["extra"]["prompt_lengths"] == [264, 352]

  # The first cell of each drafter builds its prefill and decode chunk; k = 3 reuses ngram's
  # prefill (k is not in it) and builds its own chunk.
  for key in (("null", 0, 0, 0), ("ngram", 1, 0, 0)):
    assert by[key]["compiles"] >= 2 and by[key]["compile_s"] > 0, key
  assert by["ngram", 3, 0, 0]["compiles"] == 1
  # Other prompt text in the same bucket, and every cell of leg 1 (a substituted prompt token and
  # another seed): data only, nothing built.
  reused = [key for key in by if key[2] == 400 or key[3] == 1]
  assert len(reused) == 9
  assert {key: by[key]["compiles"] for key in reused} == dict.fromkeys(reused, 0)
  assert by["ngram", 1, 0, 1]["seed"] != by["ngram", 1, 0, 0]["seed"]


def test_compiled_ahead_the_cells_build_nothing(tmp_path, capsys):
  jax.clear_caches()
  cfg = small_config(ks=(1, 3), prompt_tokens=(0, 400), methods=("null", "ngram"))
  driver.run(cfg, str(tmp_path), progress=False, compile_workers=2)
  rows = results.load_rows(os.path.join(tmp_path, results.RESULTS_NAME))
  assert len(rows) == 12
  # Timed calls build nothing; the process's first warm-up batch builds a few tiny eager ops.
  assert {c["compiles"] for r in rows for c in r["extra"]["calls"] if c["timed"]} == {0}
  assert sum(r["compiles"] for r in rows) <= 4
  # Three step shapes (null, ngram k=1, k=3; both prompt lengths share one bucket), the prefills
  # (null's and ngram's: one module, two executables to jax), plus the small eager ops.
  built = int(re.search(r"compiled ahead (\d+) executables", capsys.readouterr().err).group(1))
  assert 4 <= built <= 10


def test_a_sweep_over_the_mapping_budget_runs_in_waves_and_still_gates(
  tmp_path, capsys, monkeypatch
):
  # Mappings counted from this test's start, and a budget of about one tiny executable's worth (a
  # generate of a test model leaves ~230): compile-ahead stops after the first cells, which run
  # both legs before the rest compile; between cells, executables are dropped when over it.
  jax.clear_caches()
  real = mappings.memory_maps
  start = real()
  monkeypatch.setattr(mappings, "memory_maps", lambda: real() - start)
  monkeypatch.setattr(mappings, "map_budget", lambda: 300)
  driver.run(small_config(ks=(1, 3)), str(tmp_path), progress=False, compile_workers=2)
  rows = results.load_rows(os.path.join(tmp_path, results.RESULTS_NAME))
  assert len(rows) == 6 and all(r["gate_passed"] for r in rows)
  assert {c["compiles"] for r in rows for c in r["extra"]["calls"] if c["timed"]} == {0}
  order = [(r["method"], r["k"], r["leg"]) for r in rows]
  assert order[-2:] == [("ngram", 3, 0), ("ngram", 3, 1)]  # a later wave, both legs together
  err = capsys.readouterr().err
  assert int(re.search(r"dropped jax's executables (\d+) time\(s\) at 300 ", err).group(1)) >= 1


class FakeLowered:
  """A `Lowered` whose module text is `text` and whose compile calls on_compile(text); lowerings
  of one `_lowering` object are one executable to jax (calls with equal static arguments)."""

  def __init__(self, text, on_compile, lowering=None):
    self.text, self.on_compile = text, on_compile
    self._lowering = object() if lowering is None else lowering

  def as_text(self):
    return self.text

  def compile(self):
    self.on_compile(self.text)


class FakeRunner:
  """Cells in one bucket; lower_ahead(cell) gives what `lower(cell)` returns."""

  def __init__(self, lower):
    self.lower = lower

  def bucket(self, cell):
    return 64

  def lower_ahead(self, cell):
    return self.lower(cell)


def test_cells_lower_on_the_calling_thread_in_order_and_compile_on_workers():
  # Lowering order decides Mosaic GPU kernels' module text, hence the persistent-cache keys: the
  # sweep lowers on one thread in the cells' order (the same in every run) and dedupes what jax
  # shares (one lowering object) before the parallel compiles.
  import threading

  from specdec.lab.sweep import Cell

  lowered_on, compiled_on, lowerings = [], [], {}

  def compiled(text):
    compiled_on.append((text, threading.get_ident()))

  def lower(cell):
    lowered_on.append((cell.method, cell.k, threading.get_ident()))
    texts = f"prefill {cell.method}", f"step {cell.method} {cell.k}"
    return [FakeLowered(t, compiled, lowerings.setdefault(t, object())) for t in texts]

  cell = Cell("ngram", 1, "w", 0, 0.0, 0, 1.0, "greedy", "bf16", "model", 1, 0)
  cells = [cell, dataclasses.replace(cell, k=3), dataclasses.replace(cell, workload="v")]
  driver.compile_cells(FakeRunner(lower), cells, workers=2)
  me = threading.get_ident()
  assert lowered_on == [("ngram", 1, me), ("ngram", 3, me)]  # the third shares the first's shapes
  assert sorted(t for t, _ in compiled_on) == ["prefill ngram", "step ngram 1", "step ngram 3"]
  assert all(tid != me for _, tid in compiled_on)


def test_no_cell_is_lowered_ahead_past_90_percent_of_the_mapping_budget(monkeypatch):
  # Each compile takes 50 ms, then holds 100 mappings. Lowering is instant, so without waiting
  # for queued compiles every cell would lower at a count of 0. With one worker and a budget of
  # 300, cell 3 lowers at <= 200 mappings (<= 270) and cell 5 finds at least 3 compiles done.
  import time

  from specdec.lab.sweep import Cell

  lowered, compiled = [], []

  def compile_slowly(text):
    time.sleep(0.05)
    compiled.append(text)

  def lower(cell):
    lowered.append(cell.k)
    return [FakeLowered(f"step {cell.k}", compile_slowly)]

  monkeypatch.setattr(mappings, "memory_maps", lambda: 100 * len(compiled))
  cell = Cell("ngram", 1, "w", 0, 0.0, 0, 1.0, "greedy", "bf16", "model", 1, 0)
  cells = [dataclasses.replace(cell, k=k) for k in range(1, 7)]
  driver.compile_cells(FakeRunner(lower), cells, workers=1, budget=300)
  assert lowered in ([1, 2, 3], [1, 2, 3, 4])
  lowered.clear()
  driver.compile_cells(FakeRunner(lower), cells, workers=1, budget=0)  # no budget: every cell
  assert lowered == [1, 2, 3, 4, 5, 6]


def test_one_module_that_jax_keys_apart_compiles_for_each():
  # The null arm's prefill and a k = 1 drafter's lower to the same HLO under different static
  # arguments: jax looks each up apart, so compiling one ahead would leave the other to its cell.
  from specdec.lab.sweep import Cell

  compiled = []
  cell = Cell("ngram", 1, "w", 0, 0.0, 0, 1.0, "greedy", "bf16", "model", 1, 0)
  runner = FakeRunner(lambda c: [FakeLowered("prefill", compiled.append)])
  driver.compile_cells(runner, [cell, dataclasses.replace(cell, method="null", k=0)], workers=1)
  assert compiled == ["prefill", "prefill"]


def test_compiles_start_while_later_cells_are_still_lowering():
  import threading

  from specdec.lab.sweep import Cell

  first_compiled, waited = threading.Event(), []

  def lower(cell):
    if cell.k == 3:  # the last cell lowers only once an earlier module has compiled
      waited.append(first_compiled.wait(timeout=10))
    return [FakeLowered(f"step {cell.k}", lambda _: first_compiled.set())]

  cell = Cell("ngram", 1, "w", 0, 0.0, 0, 1.0, "greedy", "bf16", "model", 1, 0)
  driver.compile_cells(FakeRunner(lower), [cell, dataclasses.replace(cell, k=3)], workers=1)
  assert waited == [True]
