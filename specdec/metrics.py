"""Everything derived from what the decode loop counts.

The loop stores, per sequence: `accept_hist [n_buckets, k+1]`, entry [b, j] the verify steps that
started with a context length in bucket b and whose verifier accepted exactly j of the k drafts;
`censored_hist`, the same for the subset of those steps whose emission the budget or an EOS cut
short; and `emitted_by_bucket [n_buckets]`, the tokens those steps emitted. Every figure here is a
function of these counts, so curves can be re-derived offline from the stored rows.

Conventions (docs/design.md, "Metrics"):
* tau = emitted tokens / target forwards: the bonus token included, the prefill's first token
  excluded (it costs the prefill, not a verify step); in [1, k+1].
* tau_accepted = 1 + mean accepted drafts per step, the verifier's count: what tau would be if no
  step were cut. It is the measured counterpart of Leviathan's predicted tau.
* acceptance rate = accepted / proposed (vLLM's `draft_acceptance_rate`), over every verify step:
  a cut limits what a step emits, not what its verifier judged, so censored steps count in full.
* per-position acceptance is unconditional (vLLM: fraction of steps whose first i+1 drafts were all
  accepted; tau_accepted = 1 + their sum) and conditional (P(position i accepted | positions < i
  accepted)).
* Undefined quantities (no steps, an unobserved position) are NaN, never 0: a 0 would read as
  "measured and always rejected".
"""

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

DEFAULT_CTX_EDGES = (0, 256, 512, 1024, 2048, math.inf)


# --- context-length buckets ---------------------------------------------------------------------


def n_ctx_buckets(edges: Sequence[float] = DEFAULT_CTX_EDGES) -> int:
  """Number of buckets that `edges` defines (len(edges) - 1)."""
  _check_edges(edges)
  return len(edges) - 1


def ctx_bucket(length, edges: Sequence[float] = DEFAULT_CTX_EDGES, xp=np):
  """Bucket index of a context length: bucket b holds edges[b] <= length < edges[b+1].

  `length` is the number of tokens already committed when a verify step starts (the sequence's
  `lengths` entry before the step), so a step is binned by the context it drafted from. Lengths
  below edges[0] fall into bucket 0 and lengths >= edges[-1] into the last bucket, so every step is
  counted. Only the interior edges are searched, which keeps `inf` out of the device computation:
  pass `xp=jax.numpy` to use the same rule inside the jitted step.
  """
  _check_edges(edges)
  interior = xp.asarray(edges[1:-1], dtype=xp.int32)
  return xp.searchsorted(interior, length, side="right").astype(xp.int32)


def bucket_labels(edges: Sequence[float] = DEFAULT_CTX_EDGES) -> list[str]:
  """Half-open interval labels, e.g. '[0,256)' ... '[2048,inf)'."""
  _check_edges(edges)
  fmt = lambda e: "inf" if math.isinf(e) else str(int(e))
  return [f"[{fmt(lo)},{fmt(hi)})" for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


def _check_edges(edges: Sequence[float]) -> None:
  if len(edges) < 2 or any(b <= a for a, b in zip(edges[:-1], edges[1:], strict=True)):
    raise ValueError(f"context bucket edges must be >= 2 strictly increasing values, got {edges}")


# --- acceptance from the histogram --------------------------------------------------------------


def flat_hist(hist) -> np.ndarray:
  """Sum a histogram [..., k+1] over every leading axis (buckets, sequences) to [k+1] float64."""
  h = np.asarray(hist, dtype=np.float64)
  if h.ndim == 0:
    raise ValueError("accept_hist must have a trailing axis of size k+1")
  if np.any(h < 0):
    raise ValueError("accept_hist has negative counts")
  return h.reshape(-1, h.shape[-1]).sum(axis=0)


def merge_hists(hists: Sequence) -> np.ndarray:
  """Element-wise sum of same-shaped histograms (sequences, legs) as int64."""
  if not hists:
    raise ValueError("merge_hists needs at least one histogram")
  arrs = [np.asarray(h, dtype=np.int64) for h in hists]
  shapes = {a.shape for a in arrs}
  if len(shapes) != 1:
    raise ValueError(f"histograms differ in shape: {sorted(shapes)}")
  return np.sum(arrs, axis=0)


def n_steps(hist) -> int:
  return int(flat_hist(hist).sum())


def draft_len(hist) -> int:
  """k, read off the histogram's trailing axis."""
  return int(np.shape(hist)[-1]) - 1


def tau(emitted: float, steps: float) -> float:
  """Tokens emitted per target forward (bonus included, prefill's first token not); NaN with no
  steps. The definition every table, plot and prediction beside it uses."""
  if emitted < 0 or steps < 0:
    raise ValueError(f"need emitted >= 0 and steps >= 0, got {emitted} / {steps}")
  return math.nan if steps == 0 else float(emitted / steps)


def tau_accepted(hist) -> float:
  """1 + mean accepted drafts per step (the verifier's count), in [1, k+1]; NaN with no steps.

  Equals `tau` when no step was cut by the budget or an EOS, and exceeds it otherwise.
  """
  h = flat_hist(hist)
  n = h.sum()
  if n == 0:
    return math.nan
  return float(1.0 + (np.arange(h.size) * h).sum() / n)


def acceptance_rate(accepted: float, proposed: float) -> float:
  """accepted / proposed; NaN when nothing was proposed (the k = 0 baseline)."""
  if proposed < 0 or accepted < 0 or accepted > proposed:
    raise ValueError(f"need 0 <= accepted <= proposed, got {accepted} / {proposed}")
  return math.nan if proposed == 0 else float(accepted / proposed)


def acceptance_rate_from_hist(hist) -> float:
  """accepted / proposed assuming every counted step proposed exactly k tokens."""
  h = flat_hist(hist)
  k = h.size - 1
  return acceptance_rate(float((np.arange(h.size) * h).sum()), float(k * h.sum()))


def per_position_uncond(hist) -> np.ndarray:
  """[k]: entry i = fraction of steps whose first i+1 drafts were all accepted (NaN with no steps).

  Summing gives tau_accepted - 1, the identity vLLM's per-position vector satisfies.
  """
  h = flat_hist(hist)
  n = h.sum()
  if n == 0:
    return np.full(h.size - 1, np.nan)
  at_least = np.cumsum(h[::-1])[::-1]  # at_least[j] = steps that accepted >= j
  return at_least[1:] / n


def per_position_cond(hist) -> np.ndarray:
  """[k]: entry i = P(draft i accepted | drafts 0..i-1 accepted); NaN where no step reached i."""
  h = flat_hist(hist)
  at_least = np.cumsum(h[::-1])[::-1]
  reached, passed = at_least[:-1], at_least[1:]
  out = np.full(h.size - 1, np.nan)
  np.divide(passed, reached, out=out, where=reached > 0)
  return out


def alpha_mle(hist) -> float:
  """Per-token acceptance alpha for Leviathan's formula: the MLE under i.i.d. acceptance.

  Model: each draft is accepted with probability alpha independently, and a step stops at the first
  rejection or after k drafts, so its accepted count is a truncated geometric. The likelihood is
  alpha^S (1 - alpha)^F with S = total accepted drafts and F = steps that hit a rejection (accepted
  count < k), so the MLE is S / (S + F). It counts only the drafts that were actually judged; the
  plain acceptance rate S / (k * steps) also counts drafts after the first rejection as failures and
  is biased low for k > 1. NaN when nothing was judged (no steps, or k = 0).
  """
  h = flat_hist(hist)
  s = float((np.arange(h.size) * h).sum())
  f = float(h[:-1].sum())
  return math.nan if s + f == 0 else s / (s + f)


def predicted_tau(alpha: float, k: int) -> float:
  """Leviathan et al. 2023 eq. 1: expected tokens per target forward, (1 - a^(k+1)) / (1 - a)."""
  if math.isnan(alpha):
    return math.nan
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must be in [0, 1], got {alpha}")
  if alpha == 1.0:
    return float(k + 1)
  return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: int, cost_ratio: float) -> float:
  """Leviathan et al. 2023 Theorem 3.8: walltime improvement with draft/target cost ratio c.

  (1 - a^(k+1)) / ((1 - a)(k c + 1)); assumes the verify of k+1 tokens costs one target forward.
  """
  return predicted_tau(alpha, k) / (k * cost_ratio + 1.0)


# The loop's counters `acceptance_summary` takes, in its argument order (generate's stats keys).
COUNTS = ("accept_hist", "censored_hist", "emitted_by_bucket")


def acceptance_summary(hist, censored_hist, emitted_B) -> dict:
  """The acceptance fields of a result row from pooled counts: accept_hist and censored_hist
  [n_buckets, k+1] and emitted_by_bucket [n_buckets] (summed over rows and requests)."""
  h, c, e = np.asarray(hist), np.asarray(censored_hist), np.asarray(emitted_B)
  if h.ndim != 2 or h.shape != c.shape or e.shape != h.shape[:1]:
    raise ValueError(
      f"accept_hist {h.shape}, censored_hist {c.shape} and emitted_by_bucket {e.shape} "
      "must be [n_buckets, k+1], [n_buckets, k+1] and [n_buckets]"
    )
  if np.any(c > h):
    raise ValueError("censored_hist counts more steps than accept_hist somewhere")
  k, a, steps = draft_len(h), alpha_mle(h), n_steps(h)
  flat = flat_hist(h)
  return {
    "steps": steps,
    "emitted": int(e.sum()),
    "censored": n_steps(c),
    "accepted": int((np.arange(flat.size) * flat).sum()),
    "proposed": int(k * steps),
    "tau": tau(float(e.sum()), steps),
    "tau_accepted": tau_accepted(h),
    "acceptance_rate": acceptance_rate_from_hist(h),
    "per_position_uncond": per_position_uncond(h).tolist(),
    "per_position_cond": per_position_cond(h).tolist(),
    "alpha": a,
    "predicted_tau": predicted_tau(a, k),
    "tau_by_bucket": [tau(float(eb), n_steps(row)) for row, eb in zip(h, e, strict=True)],
  }


def per_request(steps, emitted, accepted, proposed) -> dict:
  """Per-request tau and acceptance rate from per-request counters (sequences of equal length)."""
  return {
    "tau": [tau(float(e), float(s)) for e, s in zip(emitted, steps, strict=True)],
    "acceptance_rate": [
      acceptance_rate(float(a), float(p)) for a, p in zip(accepted, proposed, strict=True)
    ],
  }


def tau_knee(ks: Sequence[int], taus: Sequence[float], threshold: float = 0.1) -> int:
  """The draft-budget knee: the first k after which extra drafts stop paying in tau.

  With the measured (k, tau) points sorted by k, the marginal gain between neighbours is
  (tau[i+1] - tau[i]) / (k[i+1] - k[i]) tokens per extra draft token. The knee is the first k[i]
  whose next gain falls below `threshold`, or the largest k if none does. Defined on tau alone so it
  is a property of the drafter and workload, not of the device; the device-optimal k is `best_k`.
  """
  pts = sorted((int(k), float(t)) for k, t in zip(ks, taus, strict=True) if not math.isnan(t))
  if not pts:
    raise ValueError("tau_knee needs at least one measured (k, tau) point")
  for (k0, t0), (k1, t1) in zip(pts[:-1], pts[1:], strict=True):
    if (t1 - t0) / (k1 - k0) < threshold:
      return k0
  return pts[-1][0]


def best_k(ks: Sequence[int], values: Sequence[float]) -> int:
  """The k with the highest value (e.g. decode tok/s); NaN values are skipped."""
  pts = [(float(v), int(k)) for k, v in zip(ks, values, strict=True) if not math.isnan(v)]
  if not pts:
    raise ValueError("best_k needs at least one measured value")
  return max(pts)[1]


# --- timing -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Request:
  """Host timestamps (seconds, one monotonic clock) of one request of a leg, in issue order."""

  start_s: float
  first_token_s: float
  end_s: float
  n_out: int  # completion tokens, the first one included

  @property
  def ttft_ms(self) -> float:
    return 1000.0 * (self.first_token_s - self.start_s)

  @property
  def latency_ms(self) -> float:
    return 1000.0 * (self.end_s - self.start_s)


def tpot_ms(latency_ms, ttft_ms, n_out) -> np.ndarray:
  """Time per output token after the first: (latency - ttft) / (n_out - 1); NaN where n_out < 2."""
  lat, ttft, n = (np.asarray(x, dtype=np.float64) for x in (latency_ms, ttft_ms, n_out))
  out = np.full(np.broadcast(lat, ttft, n).shape, np.nan)
  np.divide(lat - ttft, n - 1, out=out, where=n >= 2)
  return out


def decode_tok_s(tpot: Sequence[float]) -> float:
  """Decode-only rate, 1000 / mean(tpot_ms) over requests with a defined tpot; NaN if none."""
  t = np.asarray(tpot, dtype=np.float64)
  t = t[~np.isnan(t)]
  return math.nan if t.size == 0 or t.mean() <= 0 else float(1000.0 / t.mean())


def whole_tok_s(completion_tokens: float, wall_s: float) -> float:
  """Whole-run rate: completion tokens / wall clock of the leg (prefill and host time included)."""
  return math.nan if wall_s <= 0 else float(completion_tokens / wall_s)


def percentiles(values: Sequence[float], qs=(50, 90, 99)) -> list[float]:
  """Linear-interpolation percentiles (numpy default); NaN for an empty sample.

  With few requests p99 is close to the max; the row also stores the request count.
  """
  v = np.asarray(values, dtype=np.float64)
  v = v[~np.isnan(v)]
  if v.size == 0:
    return [math.nan] * len(qs)
  return [float(x) for x in np.percentile(v, qs)]


def timing_summary(requests: Sequence[Request], discard_first: int) -> dict:
  """The timing fields of a result row for one leg.

  The first `discard_first` requests are cold (compilation, caches) and are dropped from every
  figure (docs/design.md, "Measurement conventions"): the whole first batch, so B of them when B
  requests decode together. The caller states it; there is no default that fits every batch. The
  whole-run wall clock then runs from the earliest start to the latest end of the kept requests,
  which is right for sequential and for concurrent issue alike.
  """
  if discard_first < 0:
    raise ValueError(f"discard_first must be >= 0, got {discard_first}")
  kept = list(requests)[discard_first:]
  if not kept:
    nan = math.nan
    return {
      "decode_tok_s": nan,
      "whole_tok_s": nan,
      "tpot_ms_mean": nan,
      "ttft_ms_median": nan,
      "ttft_ms_p90": nan,
      "ttft_ms_p99": nan,
      "completion_tokens": 0,
      "wall_s": nan,
      "n_requests_timed": 0,
    }
  ttft = [r.ttft_ms for r in kept]
  tpot = tpot_ms([r.latency_ms for r in kept], ttft, [r.n_out for r in kept])
  tokens = sum(r.n_out for r in kept)
  wall = max(r.end_s for r in kept) - min(r.start_s for r in kept)
  med, p90, p99 = percentiles(ttft)
  t = tpot[~np.isnan(tpot)]
  return {
    "decode_tok_s": decode_tok_s(tpot),
    "whole_tok_s": whole_tok_s(tokens, wall),
    "tpot_ms_mean": float(t.mean()) if t.size else math.nan,
    "ttft_ms_median": med,
    "ttft_ms_p90": p90,
    "ttft_ms_p99": p99,
    "completion_tokens": int(tokens),
    "wall_s": float(wall),
    "n_requests_timed": len(kept),
  }


# --- comparing arms and legs --------------------------------------------------------------------


def speedup(value: float, baseline: float) -> float:
  """value / baseline for rates (tok/s); NaN if either is missing or the baseline is not > 0."""
  if math.isnan(value) or math.isnan(baseline) or baseline <= 0:
    return math.nan
  return float(value / baseline)


def speedups(values_by_arm: dict[str, float], baseline_arm: str) -> dict[str, float]:
  """Every arm's rate relative to the named baseline arm (the baseline maps to 1.0)."""
  if baseline_arm not in values_by_arm:
    raise KeyError(f"baseline arm {baseline_arm!r} not among {sorted(values_by_arm)}")
  base = values_by_arm[baseline_arm]
  return {arm: speedup(v, base) for arm, v in values_by_arm.items()}


def leg_spread(values: Sequence[float]) -> dict:
  """Mean over legs and how far they disagree.

  `rel_half_range` = (max - min) / (2 mean) is what tables print as "±x%": with two legs it is the
  distance of either leg from the mean. NaN legs are ignored.
  """
  v = np.asarray(values, dtype=np.float64)
  v = v[~np.isnan(v)]
  if v.size == 0:
    return {"n": 0, "mean": math.nan, "min": math.nan, "max": math.nan, "rel_half_range": math.nan}
  mean = float(v.mean())
  half = float(v.max() - v.min()) / 2.0
  return {
    "n": int(v.size),
    "mean": mean,
    "min": float(v.min()),
    "max": float(v.max()),
    "rel_half_range": half / abs(mean) if mean != 0 else math.nan,
  }


# --- intervals ----------------------------------------------------------------------------------

# Bootstrap confidence intervals over requests: the level and resample count every table and plot
# states (docs/design.md, "Metrics").
CI_LEVEL = 0.95
CI_RESAMPLES = 2000


def complete_rows(columns: Sequence) -> list[np.ndarray]:
  """Equal-length 1-D columns as float64, without the rows that hold a NaN in any column."""
  cols = [np.asarray(c, dtype=np.float64) for c in columns]
  if not cols or any(c.ndim != 1 for c in cols) or len({c.size for c in cols}) != 1:
    raise ValueError(f"need >= 1 equal-length 1-D columns, got shapes {[c.shape for c in cols]}")
  keep = ~np.any([np.isnan(c) for c in cols], axis=0)
  return [c[keep] for c in cols]


def paired_bootstrap_ci(
  columns: Sequence,
  stat: Callable[..., np.ndarray],
  level: float = CI_LEVEL,
  resamples: int = CI_RESAMPLES,
  seed: int = 0,
) -> tuple[float, float]:
  """Percentile bootstrap interval (lo, hi) of stat(*columns) over rows (requests).

  Each resample draws n row indices with replacement and takes the same rows of every column, so
  measurements of one request (or of one prompt under two arms) stay paired. `stat` gets one
  [resamples, n] array per column and reduces the last axis. Rows with a NaN in any column are
  dropped first; (NaN, NaN) when none is left, (v, v) for a single row. Resamples whose statistic
  is undefined (a zero denominator) are left out of the quantiles.
  """
  if not 0.0 < level < 1.0:
    raise ValueError(f"level must be in (0, 1), got {level}")
  if resamples < 1:
    raise ValueError(f"resamples must be >= 1, got {resamples}")
  cols = complete_rows(columns)
  n = cols[0].size
  if n == 0:
    return math.nan, math.nan
  idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
  with np.errstate(divide="ignore", invalid="ignore"):
    boot = np.asarray(stat(*(c[idx] for c in cols)), dtype=np.float64)
  boot = boot[np.isfinite(boot)]
  if boot.size == 0:
    return math.nan, math.nan
  lo, hi = np.quantile(boot, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
  return float(lo), float(hi)


def bootstrap_ci(
  values: Sequence[float],
  stat: Callable[..., np.ndarray] = np.mean,
  level: float = CI_LEVEL,
  resamples: int = CI_RESAMPLES,
  seed: int = 0,
) -> tuple[float, float]:
  """Percentile bootstrap interval of stat(values) over requests; stat takes `axis` (np.mean,
  np.median). NaN values are dropped; (NaN, NaN) for none, (v, v) for one."""
  return paired_bootstrap_ci([values], lambda x: stat(x, axis=-1), level, resamples, seed)


def paired_ratio_ci(
  num: Sequence[float],
  den: Sequence[float],
  level: float = CI_LEVEL,
  resamples: int = CI_RESAMPLES,
  seed: int = 0,
) -> tuple[float, float]:
  """Bootstrap interval of mean(num) / mean(den), pairs (num_i, den_i) resampled jointly.

  For a speedup, num_i and den_i are the baseline's and the arm's tpot of the same prompt and leg:
  resampling the pair keeps what the prompt costs both arms, so prompt-to-prompt variation cancels.
  """
  return paired_bootstrap_ci(
    [num, den], lambda a, b: a.mean(axis=-1) / b.mean(axis=-1), level, resamples, seed
  )
