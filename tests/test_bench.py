"""The step microbenchmark runs and reports every part (timings themselves are not asserted, beyond
the forwards costing something: a slope of the near-empty loop may come out at +-0 on a CPU)."""

import math

from specdec import bench
from specdec.drafters import ngram
from tests.helpers import tiny_model


def test_time_step_reports_each_part():
  t = bench.time_step(
    tiny_model(), ngram(), bench.Shape(batch=2, k=3, prompt_tokens=20, n_steps=4, reps=2)
  )
  assert set(t) == {
    "step", "draft", "verify", "target_fwd", "loop", "accept_commit", "draft_per_token_vs_target"
  }  # fmt: skip
  assert all(math.isfinite(v) for v in t.values())
  assert all(t[key] > 0 for key in ("step", "verify", "target_fwd"))
