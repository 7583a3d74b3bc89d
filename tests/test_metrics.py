import math

import numpy as np
import pytest

from specdec import metrics


def _random_hist(rng, k, buckets=1):
  hist = rng.integers(0, 50, size=(buckets, k + 1))
  hist[rng.random(hist.shape) < 0.3] = 0  # sparse columns exercise the unobserved-position paths
  return hist


def _iid_hist(rng, alpha, k, n_steps):
  """Histogram of steps whose drafts are each accepted with prob alpha, up to the first reject."""
  accepted = rng.random((n_steps, k)) < alpha
  counts = np.where(accepted.all(axis=1), k, np.argmin(accepted, axis=1))
  return np.bincount(counts, minlength=k + 1)


def test_tau_equals_one_plus_sum_uncond_property():
  rng = np.random.default_rng(0)
  for _ in range(500):
    k = int(rng.integers(0, 12))
    hist = _random_hist(rng, k, buckets=int(rng.integers(1, 5)))
    if metrics.n_steps(hist) == 0:
      continue
    t = metrics.tau_accepted(hist)
    assert t == pytest.approx(1.0 + metrics.per_position_uncond(hist).sum())
    assert 1.0 <= t <= k + 1


def test_uncond_is_product_of_cond_property():
  rng = np.random.default_rng(1)
  for _ in range(300):
    k = int(rng.integers(1, 10))
    hist = _random_hist(rng, k)
    if metrics.n_steps(hist) == 0:
      continue
    cond = metrics.per_position_cond(hist)
    uncond = metrics.per_position_uncond(hist)
    prod = np.cumprod(np.nan_to_num(cond, nan=0.0))
    np.testing.assert_allclose(uncond, prod, atol=1e-12)
    # NaN exactly where no step reached that position.
    reached = np.cumsum(metrics.flat_hist(hist)[::-1])[::-1][:-1]
    assert np.array_equal(np.isnan(cond), reached == 0)


def test_iid_acceptance_predicted_tau_matches_measured():
  rng = np.random.default_rng(2)
  for alpha in (0.1, 0.5, 0.8, 0.95):
    for k in (1, 3, 8):
      hist = _iid_hist(rng, alpha, k, 20000)
      a_hat = metrics.alpha_mle(hist)
      assert a_hat == pytest.approx(alpha, abs=0.02)
      assert metrics.predicted_tau(a_hat, k) == pytest.approx(metrics.tau_accepted(hist), rel=0.02)
      # The conditional curve is flat at alpha under i.i.d. acceptance, where well observed.
      cond = metrics.per_position_cond(hist)
      reached = np.cumsum(hist[::-1])[::-1][:-1]
      assert np.all(np.abs(cond - alpha)[reached >= 2000] < 0.03)


def test_acceptance_rate_is_biased_low_but_mle_is_not():
  rng = np.random.default_rng(3)
  hist = _iid_hist(rng, 0.7, 6, 20000)
  assert metrics.acceptance_rate_from_hist(hist) < 0.6
  assert metrics.alpha_mle(hist) == pytest.approx(0.7, abs=0.02)


def test_predicted_tau_leviathan_table1():
  # Leviathan et al. 2023 Table 1 (c = 0): speed = expected tokens per forward.
  for a, k, speed in [(0.6, 2, 1.96), (0.7, 3, 2.53), (0.8, 5, 3.69), (0.9, 10, 6.86)]:
    assert metrics.predicted_tau(a, k) == pytest.approx(speed, abs=0.01)
  assert metrics.predicted_tau(1.0, 4) == 5.0
  assert metrics.predicted_tau(0.0, 4) == 1.0
  assert metrics.predicted_speedup(0.8, 5, 0.0) == pytest.approx(3.69, abs=0.01)


def test_no_steps_is_nan_not_zero():
  hist = np.zeros((3, 5), dtype=int)
  assert math.isnan(metrics.tau_accepted(hist)) and math.isnan(metrics.tau(0, 0))
  assert np.isnan(metrics.per_position_uncond(hist)).all()
  assert np.isnan(metrics.per_position_cond(hist)).all()
  assert math.isnan(metrics.alpha_mle(hist))
  assert math.isnan(metrics.predicted_tau(metrics.alpha_mle(hist), 4))
  assert math.isnan(metrics.acceptance_rate(0, 0))


def test_k0_baseline():
  hist = np.array([[7], [3]])
  assert metrics.tau_accepted(hist) == 1.0
  assert metrics.per_position_uncond(hist).shape == (0,)
  assert math.isnan(metrics.acceptance_rate_from_hist(hist))
  s = metrics.acceptance_summary(hist, 0 * hist, np.array([7, 3]))
  assert s["tau"] == 1.0 and s["steps"] == 10 and s["proposed"] == 0
  assert math.isnan(s["predicted_tau"])


def test_all_accepted():
  hist = np.array([0, 0, 0, 9])
  assert metrics.tau_accepted(hist) == 4.0
  assert metrics.alpha_mle(hist) == 1.0
  assert metrics.predicted_tau(1.0, 3) == 4.0
  np.testing.assert_array_equal(metrics.per_position_cond(hist), [1, 1, 1])


def test_acceptance_summary_counts():
  hist = np.array([[2, 1, 0], [0, 3, 4]])  # 10 steps, k = 2, none cut
  emitted = np.array([2 * 1 + 1 * 2, 3 * 2 + 4 * 3])
  s = metrics.acceptance_summary(hist, 0 * hist, emitted)
  assert s["steps"] == 10 and s["censored"] == 0 and s["emitted"] == 22
  assert s["accepted"] == 1 + 3 + 8
  assert s["proposed"] == 20
  assert s["acceptance_rate"] == pytest.approx(12 / 20)
  assert s["tau"] == s["tau_accepted"] == pytest.approx(1 + 12 / 10)
  np.testing.assert_allclose(s["per_position_uncond"], [8 / 10, 4 / 10])
  np.testing.assert_allclose(s["per_position_cond"], [8 / 10, 4 / 8])


def test_acceptance_summary_censored_step_by_hand():
  # k = 4, one bucket, 3 steps: accepted 4, 2 and 3 drafts; the last step (3 accepted, so 4
  # tokens on offer) was cut by the budget to 1 token. Emitted: 5 + 3 + 1 = 9.
  hist = np.array([[0, 0, 1, 1, 1]])
  censored = np.array([[0, 0, 0, 1, 0]])
  s = metrics.acceptance_summary(hist, censored, np.array([9]))
  assert s["steps"] == 3 and s["censored"] == 1 and s["emitted"] == 9
  assert s["tau"] == pytest.approx(9 / 3)
  assert s["tau_accepted"] == pytest.approx(1 + (4 + 2 + 3) / 3)  # 4.0: what the verifier took
  assert s["acceptance_rate"] == pytest.approx(9 / 12)  # the cut step's verdicts count in full
  # alpha: S = 9 accepted, F = 2 steps that hit a rejection (2 and 3 accepted of 4).
  assert s["alpha"] == pytest.approx(9 / 11)
  assert s["predicted_tau"] == pytest.approx(metrics.predicted_tau(9 / 11, 4))
  assert s["tau_by_bucket"] == [pytest.approx(3.0)]
  with pytest.raises(ValueError, match="censored_hist counts more"):
    metrics.acceptance_summary(censored, hist, np.array([9]))


def test_ctx_bucket_edges():
  edges = (0, 256, 512, 1024, 2048, math.inf)
  lengths = np.array([0, 1, 255, 256, 511, 512, 2047, 2048, 10**6])
  np.testing.assert_array_equal(metrics.ctx_bucket(lengths, edges), [0, 0, 0, 1, 1, 2, 3, 4, 4])
  assert int(metrics.ctx_bucket(300, edges)) == 1
  assert metrics.n_ctx_buckets(edges) == 5
  assert metrics.bucket_labels(edges)[0] == "[0,256)"
  assert metrics.bucket_labels(edges)[-1] == "[2048,inf)"
  with pytest.raises(ValueError):
    metrics.ctx_bucket(3, (0, 10, 10))


def test_ctx_bucket_under_jax():
  jnp = pytest.importorskip("jax.numpy")
  lengths = jnp.array([0, 256, 3000])
  np.testing.assert_array_equal(np.asarray(metrics.ctx_bucket(lengths, xp=jnp)), [0, 1, 4])


def test_merge_hists_shape_check():
  assert metrics.merge_hists([[1, 2], [3, 4]]).tolist() == [4, 6]
  with pytest.raises(ValueError):
    metrics.merge_hists([[1, 2], [3, 4, 5]])


def test_knee_and_best_k():
  ks = [1, 2, 3, 4, 6, 8]
  taus = [1.8, 2.4, 2.8, 3.0, 3.1, 3.15]  # gains 0.6, 0.4, 0.2, 0.05, ...
  assert metrics.tau_knee(ks, taus, threshold=0.1) == 4
  assert metrics.tau_knee(ks, taus, threshold=0.3) == 3
  assert metrics.tau_knee(ks, taus, threshold=0.01) == 8
  assert metrics.tau_knee([4], [3.0]) == 4
  assert metrics.best_k(ks, [100, 130, 150, 149, math.nan, 120]) == 3


def test_tpot_and_rates():
  tpot = metrics.tpot_ms([110.0, 50.0, 20.0], [10.0, 10.0, 20.0], [11, 5, 1])
  np.testing.assert_allclose(tpot[:2], [10.0, 10.0])
  assert math.isnan(tpot[2])
  assert metrics.decode_tok_s(tpot) == pytest.approx(100.0)
  assert metrics.whole_tok_s(500, 2.0) == 250.0
  assert math.isnan(metrics.whole_tok_s(5, 0.0))


def test_timing_summary_discards_the_first_requests():
  cold = metrics.Request(0.0, 5.0, 6.0, 11)  # compilation: would dominate every figure
  warm = [
    metrics.Request(10.0 + i, 10.0 + i + 0.01 * (i + 1), 10.0 + i + 0.11, 11) for i in range(5)
  ]
  s = metrics.timing_summary([cold, *warm], discard_first=1)
  assert s["n_requests_timed"] == 5
  assert s["completion_tokens"] == 55
  assert s["ttft_ms_median"] == pytest.approx(30.0)
  assert s["ttft_ms_p99"] == pytest.approx(50.0, abs=0.5)
  tpots = [(110 - 10 * (i + 1)) / 10 for i in range(5)]
  assert s["decode_tok_s"] == pytest.approx(1000 / np.mean(tpots))
  assert s["wall_s"] == pytest.approx(4.11)
  assert s["whole_tok_s"] == pytest.approx(55 / 4.11)
  empty = metrics.timing_summary([cold], discard_first=1)
  assert empty["n_requests_timed"] == 0 and math.isnan(empty["decode_tok_s"])
  # A cold batch of 2: both of its requests go, whatever their times.
  two = metrics.timing_summary([cold, cold, *warm], discard_first=2)
  assert two["n_requests_timed"] == 5 and two["decode_tok_s"] == s["decode_tok_s"]
  assert metrics.timing_summary([cold, *warm], discard_first=0)["n_requests_timed"] == 6
  with pytest.raises(TypeError):
    metrics.timing_summary([cold, *warm])  # no default: the caller states the warm-up
  with pytest.raises(ValueError, match="discard_first"):
    metrics.timing_summary([cold], discard_first=-1)


def test_speedups_and_spread():
  sp = metrics.speedups({"null": 100.0, "ngram": 150.0, "bad": math.nan}, "null")
  assert sp["null"] == 1.0 and sp["ngram"] == 1.5 and math.isnan(sp["bad"])
  with pytest.raises(KeyError, match="baseline"):
    metrics.speedups({"ngram": 1.0}, "null")
  s = metrics.leg_spread([98.0, 102.0, math.nan])
  assert s["n"] == 2 and s["mean"] == 100.0 and s["rel_half_range"] == pytest.approx(0.02)
  assert metrics.leg_spread([])["n"] == 0


def test_acceptance_summary_tau_by_bucket():
  hist = np.array([[1, 1], [0, 0]])
  s = metrics.acceptance_summary(hist, 0 * hist, np.array([3, 0]))
  assert s["tau_by_bucket"][0] == 1.5 and math.isnan(s["tau_by_bucket"][1])


def test_bootstrap_ci_covers_the_mean_of_a_known_distribution():
  rng = np.random.default_rng(1)
  trials, hits, widths = 200, 0, []
  for t in range(trials):
    x = rng.normal(5.0, 2.0, size=60)
    lo, hi = metrics.bootstrap_ci(x, resamples=400, seed=t)
    hits += lo <= 5.0 <= hi
    widths.append(hi - lo)
  assert 0.88 <= hits / trials <= 0.99  # nominal 0.95; the percentile bootstrap runs a bit low
  # The normal-theory width, 2 * 1.96 * sd / sqrt(n) = 1.01.
  assert np.mean(widths) == pytest.approx(2 * 1.96 * 2.0 / np.sqrt(60), rel=0.1)
  x = rng.normal(size=40)
  lo95, hi95 = metrics.bootstrap_ci(x)
  lo50, hi50 = metrics.bootstrap_ci(x, level=0.5)
  assert lo95 < lo50 < np.mean(x) < hi50 < hi95
  lo, hi = metrics.bootstrap_ci(x, stat=np.median)
  assert lo <= np.median(x) <= hi
  assert (metrics.CI_LEVEL, metrics.CI_RESAMPLES) == (0.95, 2000)
  with pytest.raises(ValueError, match="level"):
    metrics.bootstrap_ci(x, level=95)


def test_bootstrap_ci_drops_nan_and_handles_degenerate_samples():
  x = [1.0, 4.0, 2.0, 8.0]
  assert metrics.bootstrap_ci([1.0, math.nan, 4.0, 2.0, math.nan, 8.0]) == metrics.bootstrap_ci(x)
  assert all(map(math.isnan, metrics.bootstrap_ci([math.nan, math.nan])))
  assert all(map(math.isnan, metrics.bootstrap_ci([])))
  assert metrics.bootstrap_ci([3.5]) == (3.5, 3.5)  # one request: no spread to resample
  assert metrics.paired_ratio_ci([6.0], [2.0]) == (3.0, 3.0)
  # A pair with a NaN on either side is dropped as a whole.
  assert metrics.paired_ratio_ci([2.0, math.nan, 3.0, 5.0], [1.0, 1.0, math.nan, 2.0]) == (
    metrics.paired_ratio_ci([2.0, 5.0], [1.0, 2.0])
  )
  kept = metrics.complete_rows([[2.0, math.nan, 4.0], [1.0, 1.0, math.nan]])
  assert [c.tolist() for c in kept] == [[2.0], [1.0]]
  assert all(map(math.isnan, metrics.paired_ratio_ci([0.0, 0.0], [0.0, 0.0])))
  with pytest.raises(ValueError, match="equal-length"):
    metrics.paired_ratio_ci([1.0, 2.0], [1.0])


def test_paired_ratio_ci_contains_the_true_ratio_and_pairing_narrows_it():
  rng = np.random.default_rng(2)
  trials, hits = 100, 0
  for t in range(trials):
    base = rng.lognormal(3.0, 0.6, size=40)  # per-prompt cost varies a lot
    arm = base * 0.5 * rng.uniform(0.9, 1.1, size=40)  # the arm halves every prompt's cost
    lo, hi = metrics.paired_ratio_ci(base, arm, resamples=400, seed=t)
    hits += lo <= 2.0 <= hi  # E[base] / E[arm] = 1 / (0.5 * E[U(0.9, 1.1)]) = 2
  assert hits / trials >= 0.88
  lo, hi = metrics.paired_ratio_ci(base, arm)
  assert lo <= base.mean() / arm.mean() <= hi
  # Breaking the pairing (another prompt's baseline) leaves the prompt variation in: far wider.
  lo_u, hi_u = metrics.paired_ratio_ci(rng.permutation(base), arm)
  assert hi - lo < 0.3 * (hi_u - lo_u)
