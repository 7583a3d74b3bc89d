"""Workloads and context length as sweep axes: long documents cut to exact lengths, prompts
extended with real text, multi-turn records answered by the target, rows and tables per workload."""

import json

import jax.numpy as jnp
import ml_collections
import pytest

import specdec
from configs import default
from specdec.checkpoint.zoo import resolve_path
from specdec.data import workload as wl
from specdec.lab import driver, results, sweep, tables
from specdec.lab.sweep import SweepError
from tests.lab.test_sweep import TARGET, small_config

TURNS = {
  "r1": ["def add(a, b):\n    return", "def sub(a, b):\n    return"],
  "r2": ["import os\n\ndef main():", "class Point:\n    def __init__(self):"],
}


def _mt_bench(tmp_path):
  path = tmp_path / "mt_tiny.jsonl"
  path.write_text("".join(json.dumps({"id": i, "turns": t}) + "\n" for i, t in TURNS.items()))
  return str(path)


def _runner(**kw):
  cfg = sweep.normalize(small_config(**kw))
  return sweep.Runner(cfg, specdec.load(TARGET, dtype=jnp.float32), {}), sweep.expand(cfg)


def test_the_default_sweeps_k_by_context_up_to_the_zoo_limit_for_every_drafter():
  cfg = sweep.normalize(default.get_config())
  cells = sweep.expand(cfg)
  contexts = sorted({c.prompt_tokens for c in cells})
  with open(f"{resolve_path(cfg.target)}/config.json") as f:
    room = json.load(f)["max_position_embeddings"]
  # The longest stops at a quarter of the target's positions: a CPU prefill grows ~T^2 and the
  # run must stay under 5 minutes (configs/default.py says why and how to reach the limit).
  assert len(contexts) >= 3 and contexts[-1] >= room // 4
  assert cfg.workloads == ("jax_source",) and wl.is_document_workload(cfg.workloads[0])
  # Every drafter but suffix decoding, which runs in configs/suffix.py on the workload it is for
  # (in the default sweep it took 5 min 44 s, past the 5 minutes; docs/benchmarks.md).
  assert set(cfg.methods) == {*sweep.MODEL_FREE, *cfg.checkpoints.keys()} - {"suffix"}
  main = [c for c in cells if c.target == cfg.target]
  drafted = {(c.method, c.k, c.prompt_tokens) for c in main if c.method != "null"}
  assert len(drafted) == (len(cfg.methods) - 2) * len(cfg.ks) * len(contexts)
  # The hybrid target (issue 25) with its MTP head: one context, two k, its own no-draft arm.
  hybrid = {(c.method, c.k, c.prompt_tokens) for c in cells if c.target == "zoo:hybrid"}
  assert hybrid == {("null", 0, 512), ("hybrid_mtp", 2, 512), ("hybrid_mtp", 4, 512)}
  # A document prompt is exactly prompt_tokens long, so this is the check the sweep makes.
  sweep.validate(cfg, cells, room, lambda c: c.prompt_tokens)
  with pytest.raises(SweepError, match=f"exceeds the cache room of {room}"):
    sweep.validate(cfg, cells, room, lambda c: room)  # a prompt that fills every position


def test_documents_are_cut_and_prompts_extended_to_the_exact_length():
  runner, cells = _runner(workloads=("jax_source", "humaneval"), prompt_tokens=(100, 300))
  encode = runner.target.encode
  docs = wl.source_documents()
  for c in cells:
    ids = runner.prompt_ids(c, 0)
    if c.workload == "jax_source":
      assert ids == [encode(d.text)[: c.prompt_tokens] for d in docs[:2]]
    else:  # HumanEval's prompts (264 and 352 tokens here) end as they are, real text in front
      plain = [encode(p.text) for p in runner.prompts["humaneval"]]
      assert [len(p) for p in ids] == [max(len(p), c.prompt_tokens) for p in plain]
      assert all(p[-len(q) :] == q for p, q in zip(ids, plain, strict=True))
    leg1 = runner.prompt_ids(c, 1)
    assert all(a[1] != b[1] and a[2:] == b[2:] for a, b in zip(ids, leg1, strict=True))
  assert runner.longest_prompt(cells[0]) == 100 and runner.bucket(cells[0]) == 128


def test_bad_workload_configs_are_refused_before_anything_loads(tmp_path):
  out = tmp_path / "run"
  cfg = small_config(workloads=("jax_source",), prompt_tokens=(0, 64))
  with pytest.raises(SweepError, match="workload 'jax_source' cuts documents .* lengths > 0"):
    driver.run(cfg, str(out), progress=False)
  with pytest.raises(SweepError, match=r"config.workloads: '/no/such.jsonl': cannot read"):
    driver.run(small_config(workloads=("/no/such.jsonl",)), str(out), progress=False)
  with pytest.raises(SweepError, match="config.workloads is empty"):
    driver.run(small_config(workloads=()), str(out), progress=False)
  assert not out.exists()


def test_a_config_with_the_old_single_workload_still_reads():
  cfg = small_config()
  with cfg.unlocked():
    del cfg["workloads"]
    cfg.workload = "humaneval"
  new = sweep.normalize(cfg)
  assert new.workloads == ("humaneval",) and "workload" not in new
  assert {c.workload for c in sweep.expand(new)} == {"humaneval"}
  both = ml_collections.ConfigDict({**small_config().to_dict(), "workload": "humaneval"})
  with pytest.raises(SweepError, match="config.workload='humaneval' and config.workloads"):
    sweep.normalize(both)


def test_workloads_split_by_commas_on_the_command_line():
  # --config.workloads=humaneval,jax_source arrives as one string in a tuple (config_flags).
  cfg = sweep.normalize(small_config(workloads=("humaneval, jax_source",)))
  assert cfg.workloads == ("humaneval", "jax_source")


def test_every_turn_runs_after_the_targets_own_answers(tmp_path):
  runner, cells = _runner(workloads=(_mt_bench(tmp_path),), n_prompts=4)
  assert [p.id for p in runner.prompts[cells[0].workload]] == [
    "r1/turn1", "r1/turn2", "r2/turn1", "r2/turn2",
  ]  # fmt: skip
  null = next(c for c in cells if c.method == "null")
  ids = runner.prompt_ids(null, 0)
  target, eos = runner.target, set(runner.target.config.eos_token_ids)
  for r, (first, second) in enumerate(TURNS.values()):
    # The answer to turn 1 is the target's greedy continuation of it, no drafter, as long as the
    # sweep's budget: what the no-draft arm emits for that request.
    out = specdec.generate(target, [target.encode(first)], max_new_tokens=8).tokens[0]
    answer = target.decode([t for t in out if t not in eos])
    assert answer.strip() and runner._answers[(first,)] == answer
    arm = runner._generate(null, [ids[2 * r]], 0).tokens[0]
    assert target.decode([t for t in arm if t not in eos]) == answer
    assert ids[2 * r] == target.encode(first)
    assert ids[2 * r + 1] == target.encode(first + answer + wl.TURN_SEP + second)
  assert len(runner._answers) == 2  # only turns something follows are answered, each once


def test_a_sweep_over_two_workloads_and_its_one_table(tmp_path):
  out = tmp_path / "run"
  mt = _mt_bench(tmp_path)
  cfg = small_config(workloads=("humaneval", mt), ks=(2,), n_prompts=4)
  driver.run(cfg, str(out), progress=False)
  rows = results.load_rows(out / results.RESULTS_NAME)
  assert len(rows) == 2 * 2 * 2  # (null, ngram k=2) x 2 workloads x 2 legs
  assert {r["workload"] for r in rows} == {"humaneval", mt} and all(r["gate_passed"] for r in rows)
  multi = [r for r in rows if r["workload"] == mt]
  assert all(r["extra"]["prompts"][1] == "r1/turn2" for r in multi)
  assert all(r["n_prompts"] == 4 and len(r["requests"]) == 4 for r in multi)
  md = tables.to_markdown(tables.build(rows, "method_workload"))
  assert f"| method | humaneval speedup | humaneval τ | {mt} speedup | {mt} τ |" in md
  assert md.count("| ngram (k=2) |") == 1 and md.count("| method |") == 1  # one table, one row
  # A resume of the same sweep runs nothing new.
  driver.run(cfg, str(out), progress=False)
  assert len(results.load_rows(out / results.RESULTS_NAME)) == 8
