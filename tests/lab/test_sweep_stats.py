"""What a sweep row measures: the warm-up batch left out of timing, per-request entries, the host
round trips of its generate calls, and sampling seeds as an axis."""

import math
import os

import jax
import numpy as np
import pytest

from specdec import metrics
from specdec.lab import driver, results, sweep
from specdec.lab.sweep import SweepError
from tests.lab.test_sweep import small_config

REQUEST_KEYS = {
  "n_out", "ttft_ms", "latency_ms", "tpot_ms", "steps", "emitted", "accepted", "proposed", "tau",
  "acceptance_rate", "timed",
}  # fmt: skip


def _rows(out):
  return results.load_rows(os.path.join(out, results.RESULTS_NAME))


def _decode_tok_s(entries):
  return metrics.decode_tok_s([math.nan if e["tpot_ms"] is None else e["tpot_ms"] for e in entries])


def _warm_up_legs(out, batch):
  """Leg 0 and leg 1 of a one-cell null sweep whose executables are built in leg 0's first batch,
  after the structural checks: compiles only in that untimed batch, which leaves out all of it."""
  jax.clear_caches()  # leg 0 builds its executables, whatever ran before in this process
  # Three timed batches of 63 steps each.
  cfg = small_config(methods=("null",), batches=(batch,), n_prompts=4 * batch, max_new_tokens=64)
  driver.run(cfg, str(out), progress=False, compile_workers=0)  # compiles in batch 0
  (leg0,) = [r for r in _rows(out) if r["leg"] == 0]
  (leg1,) = [r for r in _rows(out) if r["leg"] == 1]
  calls0 = leg0["extra"]["calls"]
  assert [c["timed"] for c in calls0] == [False, True, True, True]
  assert calls0[0]["compiles"] >= 1 and sum(c["compiles"] for c in calls0[1:]) == 0  # in batch 0
  for r in (leg0, leg1):
    assert r["n_requests_timed"] == 3 * batch
    assert [e["timed"] for e in r["requests"]] == [False] * batch + [True] * 3 * batch
    assert r["decode_tok_s"] == pytest.approx(_decode_tok_s(r["requests"][batch:]))
  return leg0, leg1


def _timing_misses(leg0, leg1, batch):
  """What the timing claims miss in one run: with the first batch left out the legs agree, and
  (negative control, batch 2) leaving out request 0 alone, the old rule, keeps request 1, which
  shared batch 0's compile, and puts leg 0 far below leg 1."""
  misses = []
  ratio = leg0["decode_tok_s"] / leg1["decode_tok_s"]
  if not 0.5 <= ratio <= 2.0:
    misses.append(("legs disagree", leg0["decode_tok_s"], leg1["decode_tok_s"]))
  if batch == 2:
    old0, old1 = (_decode_tok_s(r["requests"][1:]) for r in (leg0, leg1))
    if not old0 < 0.5 * old1:
      misses.append(("old rule not below", old0, old1))
  return misses


@pytest.mark.optimized  # the negative control needs batch 0's compile to outweigh its decode
@pytest.mark.parametrize("batch", [2, 3])
def test_the_whole_first_batch_is_warm_up(tmp_path, batch):
  # A leg's timed decode is ~0.1 s: a neighbouring test's burst on this 2-core machine can halve
  # one leg's rate (seen once in CI). A systematic cost, such as a compile inside the timed
  # batches, misses in every run; a burst rarely hits two runs, so the claims get a second run.
  misses = []
  for attempt in range(2):
    misses.append(_timing_misses(*_warm_up_legs(tmp_path / str(attempt), batch), batch))
    if not misses[-1]:
      return
  pytest.fail(f"timing claims missed in both runs: {misses}")


def test_rows_keep_every_request_and_their_host_syncs(tmp_path):
  # 80 new tokens: the null arm runs 79 steps, two chunks of CHUNK_STEPS = 64.
  cfg = small_config(ks=(1, 3), n_prompts=4, batches=(2,), max_new_tokens=80)
  driver.run(cfg, str(tmp_path), progress=False)
  rows = _rows(tmp_path)
  assert {(r["method"], r["k"]) for r in rows} == {("null", 0), ("ngram", 1), ("ngram", 3)}
  for r in rows:
    entries = r["requests"]
    assert len(entries) == 4 and all(set(e) == REQUEST_KEYS for e in entries)
    # Per request: the loop's counts, tau = emitted / steps; together, the row's pooled counts.
    for e in entries:
      assert e["tau"] == pytest.approx(e["emitted"] / e["steps"])
      assert e["n_out"] == e["emitted"] + 1  # the prefill's first token is not a step's
      assert e["proposed"] == r["k"] * e["steps"]
      if r["k"]:
        assert e["acceptance_rate"] == pytest.approx(e["accepted"] / e["proposed"])
      else:
        assert e["acceptance_rate"] is None  # NaN in the row: nothing proposed
    for name in ("steps", "emitted", "accepted", "proposed"):
      assert sum(e[name] for e in entries) == r[name], name
    # One host look after the prefill and one per chunk, for every arm.
    chunk = r["extra"]["chunk_steps"]
    calls = r["extra"]["calls"]
    assert chunk == 64 and len(calls) == 2
    for c in calls:
      assert c["host_syncs"] <= math.ceil(c["loop_steps"] / chunk) + 2, (r["method"], r["k"], c)
    timed = [c for c in calls if c["timed"]]
    assert r["host_syncs"] == sum(c["host_syncs"] for c in timed)
    assert r["loop_steps"] == sum(c["loop_steps"] for c in timed)
  null = next(r for r in rows if r["method"] == "null")
  assert null["loop_steps"] == 79 and null["host_syncs"] == 3  # prefill + 2 chunks


def test_seeds_are_an_axis_of_sampled_cells_only():
  cfg = sweep.normalize(small_config(temperatures=(0.0, 0.8), seeds=(0, 5), ks=(2,)))
  cells = sweep.expand(cfg)
  greedy = [c for c in cells if c.temperature == 0]
  sampled = [c for c in cells if c.temperature > 0]
  assert {c.sample_seed for c in greedy} == {0} and len(greedy) == 2  # null, ngram k=2
  assert sorted((c.method, c.sample_seed) for c in sampled) == [
    ("ngram", 0), ("ngram", 5), ("null", 0), ("null", 5),
  ]  # fmt: skip
  assert all(c.baseline.sample_seed == c.sample_seed for c in cells)
  seeds = {sweep.leg_seed(cfg.seed, c.sample_seed, leg) for c in sampled for leg in (0, 1)}
  assert len(seeds) == 4  # every (sample seed, leg) samples with its own seed


def test_sampled_seeds_run_as_separate_resumable_cells(tmp_path):
  cfg = small_config(methods=("null",), temperatures=(0.8,), seeds=(0, 1), max_new_tokens=16)
  driver.run(cfg, str(tmp_path), progress=False)
  rows = _rows(tmp_path)
  assert sorted((r["sample_seed"], r["leg"]) for r in rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
  assert len({r["seed"] for r in rows}) == 4
  assert len({results.row_key(r) for r in rows}) == 4
  by = {(r["sample_seed"], r["leg"]): r["extra"]["output_sha"] for r in rows}
  assert by[0, 0] != by[1, 0]  # another seed samples other tokens
  driver.run(cfg, str(tmp_path), progress=False)  # a resume: every (cell, leg) is done
  assert len(_rows(tmp_path)) == 4


@pytest.mark.parametrize(
  "kw, fragment",
  [
    (dict(n_prompts=3, batches=(2,)), r"config.n_prompts=3.*config.batches=\(2,\)"),
    (dict(n_prompts=4, batches=(1, 4)), r"config.n_prompts=4.*config.batches=\(1, 4\).*8"),
    (dict(n_prompts=8, batches=(3, 4)), r"config.n_prompts=8 is not a multiple"),
    (dict(seeds=(1, 1)), r"config.seeds=\(1, 1\)"),
    (dict(seeds=()), r"config.seeds is empty"),
  ],
)
def test_configs_without_a_timed_batch_are_refused(tmp_path, kw, fragment):
  with pytest.raises(SweepError, match=fragment):
    driver.run(small_config(**kw), str(tmp_path / "run"), progress=False)
  assert not (tmp_path / "run" / "results.jsonl").exists()


def test_per_request_tau_pools_to_the_row_tau(tmp_path):
  driver.run(small_config(ks=(3,)), str(tmp_path), progress=False)
  for r in _rows(tmp_path):
    e = r["requests"]
    assert sum(x["emitted"] for x in e) / sum(x["steps"] for x in e) == pytest.approx(r["tau"])
    assert np.isfinite([x["ttft_ms"] for x in e]).all()
