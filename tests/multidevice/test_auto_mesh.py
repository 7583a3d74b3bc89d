"""k="auto" and tree="auto" under a tensor axis on the fake 4-device CPU mesh: the cost curve is
measured on the sharded step and cached under the mesh's shape, and greedy auto decoding at TP = 2
(chains through `generate` and a TP sweep, trees through `generate`) gives the single-device
tokens."""

import json

import jax
import pytest

import specdec
from specdec import sharding
from specdec.decoding import step_costs
from specdec.decoding.budget import Budget
from specdec.decoding.generate import compile_ahead
from specdec.drafters import ngram
from tests.helpers import tiny_model

PROMPTS = [[5, 9, 13, 2, 7, 7, 31, 5, 9, 13], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]]
KW = dict(max_new_tokens=12, drafter=ngram(), k="auto", budget=Budget(tiers=(1, 2)))


@pytest.fixture(scope="module")
def model():
  return tiny_model(num_attention_heads=4, num_key_value_heads=2)


def test_greedy_auto_under_tp2_gives_the_single_device_tokens(model, tmp_path, monkeypatch):
  monkeypatch.setenv(step_costs.COST_CACHE_ENV, str(tmp_path))
  timed = []  # the mesh and KV-cache split of each chunk the measurement times
  chunk = step_costs.decode_chunk

  def recording(params, draft_params, st, sc, n_steps):
    mesh = jax.sharding.get_abstract_mesh()
    timed.append(
      (None if mesh.empty else dict(mesh.shape), getattr(st.cache.k[0].sharding, "spec", None))
    )
    return chunk(params, draft_params, st, sc, n_steps)

  monkeypatch.setattr(step_costs, "decode_chunk", recording)
  want = specdec.generate(model, PROMPTS, max_new_tokens=12).tokens
  got = specdec.generate(model, PROMPTS, mesh=sharding.make_mesh(tensor=2), **KW)
  assert got.tokens == want
  assert got.stats["k"] == "auto" and sum(got.stats["tier_hist"]) == got.stats["steps"]
  tp2 = {"data": 1, "tensor": 2}
  assert timed and all(t == (tp2, sharding.KV_HEADS) for t in timed)
  (saved,) = tmp_path.glob("*.json")
  assert json.loads(saved.read_text())["key"]["mesh"] == tp2
  # The single-device curve is another key: measured again, not the mesh's loaded.
  timed.clear()
  assert specdec.generate(model, PROMPTS, **KW).tokens == want
  assert timed and all(mesh is None for mesh, _ in timed)
  assert len(list(tmp_path.glob("*.json"))) == 2


def test_auto_compiles_ahead_under_a_mesh(model):
  # What a TP sweep does: lower and compile the auto chunk for the mesh's shardings (tiers no
  # other test compiles), then decode with no compile of its own.
  mesh = sharding.make_mesh(tensor=2)
  kw = dict(KW, budget=Budget(tiers=(1, 3)), mesh=mesh, step_costs=[1.0, 1.5])
  assert compile_ahead(model, PROMPTS, **kw).count >= 1  # the chunk (the prefill may exist)
  out = specdec.generate(model, PROMPTS, **kw)
  assert out.stats["compiles"] == 0
  assert out.tokens == specdec.generate(model, PROMPTS, max_new_tokens=12).tokens


def test_greedy_tree_auto_under_tp2_gives_the_single_device_tokens(model):
  # Nested trees of 2, 3 and 4 drafted nodes, with a given curve (the measuring is the chains').
  tiers = ([(0,), (0, 0)], [(0,), (1,), (0, 0)], [(0,), (1,), (0, 0), (0, 1)])
  kw = dict(max_new_tokens=12, drafter=ngram(), tree="auto", budget=Budget(tiers=tiers))
  got = specdec.generate(
    model, PROMPTS, mesh=sharding.make_mesh(tensor=2), step_costs=[1.0, 1.05, 1.1], **kw
  )
  assert got.tokens == specdec.generate(model, PROMPTS, max_new_tokens=12).tokens
  assert (got.stats["tree"], got.stats["tiers"]) == ("auto", [2, 3, 4])
  assert sum(got.stats["tier_hist"]) == got.stats["steps"]


def test_a_tensor_parallel_sweep_runs_k_auto_with_the_single_device_outputs(tmp_path, monkeypatch):
  from specdec.lab import driver, results
  from tests.lab.test_sweep import small_config

  monkeypatch.setenv(step_costs.COST_CACHE_ENV, str(tmp_path / "costs"))
  cfg = dict(methods=("ngram",), ks=("auto",), budget_tiers=(1, 2))
  driver.run(small_config(tensor_parallel=2, **cfg), str(tmp_path / "tp2"), progress=False)
  # The single-device outputs: a plain greedy sweep's, which greedy decoding at any k gives.
  driver.run(small_config(methods=("null",)), str(tmp_path / "one"), progress=False)
  tp2, one = (results.load_rows(tmp_path / name / results.RESULTS_NAME) for name in ("tp2", "one"))
  assert all(r["gate_passed"] for r in tp2) and any(r["k"] == "auto" for r in tp2)
  outputs = lambda rows: {(r["leg"], r["extra"]["output_sha"]) for r in rows}  # noqa: E731
  assert outputs(tp2) == outputs(one)
