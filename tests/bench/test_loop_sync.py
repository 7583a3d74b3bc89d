"""The loop variants of specdec.bench.loop_sync decode the same steps; only their syncs differ."""

import math

from specdec.bench import loop_sync
from specdec.decoding import generate as generate_lib
from specdec.drafters import ngram, null
from tests.helpers import tiny_model


def test_every_variant_takes_the_same_steps_and_the_while_loop_syncs_least(monkeypatch):
  monkeypatch.setattr(generate_lib, "CHUNK_STEPS", 8)
  model = tiny_model()
  prompts = [[1, 2, 3, 4, 5, 6, 7], [3, 3, 3, 3, 3, 3, 11], [9, 8, 7]]
  rows = loop_sync.run(model, {"null": null(), "ngram": ngram()}, [3], prompts, [20], legs=1)
  by = {(r["variant"], r["method"]): r for r in rows}
  assert len(rows) == len(loop_sync.VARIANTS) * 2
  for method in ("null", "ngram"):
    steps = {v: by[v, method]["steps_per_request"] for v in loop_sync.VARIANTS}
    assert len(set(steps.values())) == 1, steps
    syncs = {v: by[v, method]["host_syncs_per_request"] for v in loop_sync.VARIANTS}
    assert syncs["while"] <= 1 + math.ceil(steps["while"] / 8) + 1  # a mean over 2 requests
    assert syncs["while"] <= syncs["host"]
  assert by["while", "null"]["steps_per_request"] == 19  # no EOS: the prefill's token, then 19
  assert by["while", "null"]["host_syncs_per_request"] == 1 + math.ceil(19 / 8)
  assert (
    by["host", "null"]["host_syncs_per_request"] > by["while", "null"]["host_syncs_per_request"]
  )
  assert "| 20 | while | null | 0 |" in loop_sync.to_markdown(rows)
