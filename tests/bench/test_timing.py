"""The step microbenchmark runs and reports every part. Timings themselves are not asserted: on a
busy 2-core CPU a slope between two short loops can come out at +-0, or below."""

import math

from specdec.bench import timing
from specdec.drafters import ngram
from tests.helpers import tiny_model


def test_time_step_reports_each_part():
  t = timing.time_step(
    tiny_model(), ngram(), timing.Shape(batch=2, k=3, prompt_tokens=20, n_steps=4, reps=2)
  )
  assert set(t) == {
    "step", "draft", "verify", "target_fwd", "loop", "accept_commit", "draft_per_token_vs_target"
  }  # fmt: skip
  assert all(math.isfinite(v) for v in t.values())
  assert t["accept_commit"] == t["step"] - t["draft"] - t["verify"] - t["loop"]
  assert t["draft_per_token_vs_target"] == t["draft"] / (3 * t["target_fwd"])
