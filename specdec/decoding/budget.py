"""k="auto": a goodput-optimal draft budget chosen on the device before every step.

A `Budget` names a few tiers, draft lengths k_1 < ... < k_N. Each tier is the existing `step` at
its k; `decode_chunk` runs them under one `jax.lax.switch` inside the chunk's on-device loop, so
all tiers live in one executable and choosing one never involves the host. The state's counters
are shaped for the largest tier K = k_N (a step at a smaller k writes fewer of their entries).

Before each step, the tier maximising the batch's goodput is chosen:

  E_b(k) = 1 + sum_{i=1..k} prod_{j<=i} alpha_bj      expected tokens a step at k emits in row b
  tier   = argmax_n  sum_{running b} E_b(k_n) / t_step(k_n)

with alpha_bj the row's estimate of P(draft j accepted | drafts < j accepted) and t_step the cost
curve (an array argument: `step_costs.py` measures and caches it). One switch serves the whole
batch, so the choice is the batch's, not a row's. See docs/design.md, "Adaptive budget".

Shapes: B rows, J = K draft positions, N tiers, L loop steps of the trace (the state's slots S:
a step of a running row emits at least one token, so a decode takes fewer steps than slots).
"""

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec.decoding.state import DecodeState
from specdec.decoding.step import StepConfig, step

DEFAULT_TIERS = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class Budget:
  """The static side of k="auto": the tiers and the estimator's constants."""

  tiers: tuple[int, ...] = DEFAULT_TIERS
  # EMA weight of the old estimate per observation: an estimate forgets an observation after
  # about 1 / (1 - decay) = 8 steps, quick enough to follow acceptance along a request, slow
  # enough that one lucky step does not flip the tier (the estimate's std at alpha = 0.5 is 0.13).
  decay: float = 0.875
  prior: float = 0.5  # alpha_j before any observation: no preference between accepting or not

  @property
  def k_max(self) -> int:
    return max(self.tiers)

  def validate(self) -> None:
    t = self.tiers
    if not t or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in t):
      raise ValueError(f"budget tiers must be integers >= 1, got tiers={t!r}")
    if list(t) != sorted(set(t)):
      raise ValueError(f"budget tiers must be strictly increasing, got tiers={t!r}")
    if not 0.0 <= self.decay < 1.0:
      raise ValueError(f"budget decay must be in [0, 1), got decay={self.decay}")
    if not 0.0 <= self.prior <= 1.0:
      raise ValueError(f"budget prior must be in [0, 1], got prior={self.prior}")

  def check_costs(self, costs) -> np.ndarray:
    """The cost curve as an array, one positive finite seconds-per-step figure per tier."""
    c = np.asarray(costs, np.float64)
    if c.shape != (len(self.tiers),) or not np.all(np.isfinite(c) & (c > 0)):
      raise ValueError(
        f"step_costs must be {len(self.tiers)} positive finite step times, one per tier "
        f"{self.tiers}, got {costs!r}"
      )
    return c.astype(np.float32)


@flax.struct.dataclass
class BudgetState:
  """The estimator and what the choices were; lives in `DecodeState.budget`."""

  alpha_BJ: jax.Array  # [B, K] f32: P(draft j accepted | drafts < j accepted), per row
  reached_BJ: jax.Array  # [B, K] int32: steps that judged draft j (tier >= j, all before accepted)
  accepted_BJ: jax.Array  # [B, K] int32: of those, the steps that accepted it
  tier_hist_BN: jax.Array  # [B, N] int32: steps a running row took at each tier
  trace_L: jax.Array  # [L] int32: the tier index of loop step l, -1 past the last
  n_loop: jax.Array  # [] int32: loop steps taken (trace entries written)


def init_state(B: int, budget: Budget, slots: int) -> BudgetState:
  """The estimator at its prior and every count at zero, as host arrays (each its own buffer:
  the state is donated)."""
  K, N = budget.k_max, len(budget.tiers)
  return BudgetState(
    alpha_BJ=np.full((B, K), budget.prior, np.float32),
    reached_BJ=np.zeros((B, K), np.int32),
    accepted_BJ=np.zeros((B, K), np.int32),
    tier_hist_BN=np.zeros((B, N), np.int32),
    trace_L=np.full((slots,), -1, np.int32),
    n_loop=np.zeros((), np.int32),
  )


def expected_tokens(alpha_BJ, tiers: tuple[int, ...]):
  """E_b(k) for every tier: [B, K] conditional acceptance -> [B, N] expected emitted tokens."""
  surv_BJ = jnp.cumprod(alpha_BJ, axis=-1)  # P(drafts 1..j all accepted)
  cum_BJ = jnp.cumsum(surv_BJ, axis=-1)
  return 1.0 + cum_BJ[:, np.asarray(tiers) - 1]


def choose(alpha_BJ, running_B, costs_N, tiers: tuple[int, ...]):
  """The tier index maximising the running rows' summed expected tokens per second."""
  e_BN = expected_tokens(alpha_BJ, tiers)
  goodput_N = jnp.sum(jnp.where(running_B[:, None], e_BN, 0.0), 0) / costs_N
  return jnp.argmax(goodput_N).astype(jnp.int32)


def observe(b: BudgetState, tier, k, running_B, n_acc_B, budget: Budget) -> BudgetState:
  """The estimator and counts after one step at tier index `tier` (k drafts, traced).

  A running row judged draft j (0-based) if j < k and its first j drafts were accepted, and
  accepted it if n_acc > j: those positions move by the EMA toward what was seen. Positions past
  the tier were not judged; they move by the same EMA toward the tier's last position (a
  constant conditional rate beyond what was tried, Leviathan's geometric assumption), so a
  small tier does not freeze the estimates that would justify a larger one.
  """
  B, K = b.alpha_BJ.shape
  j_J = jnp.arange(K)
  reached_BJ = running_B[:, None] & (j_J[None, :] < k) & (j_J[None, :] <= n_acc_B[:, None])
  hit_BJ = reached_BJ & (j_J[None, :] < n_acc_B[:, None])
  d = budget.decay
  alpha_BJ = jnp.where(reached_BJ, d * b.alpha_BJ + (1 - d) * hit_BJ, b.alpha_BJ)
  last_B = jnp.take_along_axis(alpha_BJ, jnp.broadcast_to(k - 1, (B, 1)), 1)
  beyond_BJ = running_B[:, None] & (j_J[None, :] >= k)
  alpha_BJ = jnp.where(beyond_BJ, d * alpha_BJ + (1 - d) * last_B, alpha_BJ)
  one_B = running_B.astype(jnp.int32)
  return b.replace(
    alpha_BJ=alpha_BJ,
    reached_BJ=b.reached_BJ + reached_BJ,
    accepted_BJ=b.accepted_BJ + hit_BJ,
    tier_hist_BN=b.tier_hist_BN.at[:, tier].add(one_B),
    trace_L=b.trace_L.at[b.n_loop].set(tier, mode="drop"),
    n_loop=b.n_loop + 1,
  )


def tier_configs(sc: StepConfig, budget: Budget) -> list[StepConfig]:
  return [dataclasses.replace(sc, k=k) for k in budget.tiers]


def auto_step(params, draft_params, st: DecodeState, costs_N, sc: StepConfig, budget: Budget):
  """Chooses a tier from the state's estimates, runs its step, updates the estimates."""
  running_B = ~st.done
  tier = choose(st.budget.alpha_BJ, running_B, costs_N, budget.tiers)
  branches = [functools.partial(step, sc=c) for c in tier_configs(sc, budget)]
  new = jax.lax.switch(tier, branches, params, draft_params, st)
  n_acc_B = new.accepted - st.accepted  # done rows add nothing
  k = jnp.asarray(budget.tiers, jnp.int32)[tier]
  return new.replace(budget=observe(st.budget, tier, k, running_B, n_acc_B, budget))


@functools.partial(
  jax.jit, static_argnames=("sc", "budget", "n_steps"), donate_argnames=("st",)
)  # fmt: skip
def decode_chunk(params, draft_params, st: DecodeState, costs_N, sc, budget: Budget, n_steps):
  """`step.decode_chunk` with a tier chosen before every step: up to n_steps steps in one
  on-device loop that stops once every row is done."""

  def running(carry):
    i, s = carry
    return (i < n_steps) & ~jnp.all(s.done)

  def one(carry):
    i, s = carry
    return i + 1, auto_step(params, draft_params, s, costs_N, sc, budget)

  return jax.lax.while_loop(running, one, (jnp.int32(0), st))[1]


def check_tier_shapes(params, draft_params, st: DecodeState, sc: StepConfig, budget: Budget):
  """Raises ValueError unless every tier's step returns the state's exact shapes (one switch
  needs one state type): a drafter whose state depends on k cannot run k="auto". Traces only
  (`jax.eval_shape` on abstract values), nothing compiles."""
  want, want_def = jax.tree_util.tree_flatten_with_path(jax.eval_shape(lambda s: s, st))
  for c in tier_configs(sc, budget):
    out = jax.eval_shape(functools.partial(step, sc=c), params, draft_params, st)
    got, got_def = jax.tree_util.tree_flatten_with_path(out)
    if got_def != want_def:
      raise ValueError(
        f"k='auto': a k={c.k} step returns the {sc.drafter.name} drafter's state in another "
        "structure than it takes; use a fixed k with this drafter"
      )
    for (path, w), (_, g) in zip(want, got, strict=True):
      if (w.shape, w.dtype) != (g.shape, g.dtype):
        raise ValueError(
          f"k='auto': the {sc.drafter.name} drafter's state differs between tiers "
          f"(state{jax.tree_util.keystr(path)} enters a k={c.k} step as {w.shape} {w.dtype} and "
          f"leaves it as {g.shape} {g.dtype}); use a fixed k with this drafter"
        )


def _ratio(num, den) -> list[float]:
  num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
  return np.where(den > 0, num / np.maximum(den, 1), np.nan).tolist()


COUNT_FIELDS = ("tier_hist", "position_offered", "position_reached", "position_accepted")


def counts(b: BudgetState, budget: Budget) -> dict:
  """The host copy of an auto decode's counts, summed over rows: steps per tier, and per draft
  position the steps whose tier offered it, that judged it, that accepted it; plus the k of each
  loop step in order (`k_trace`)."""
  tiers = np.asarray(budget.tiers)
  hist_N = np.asarray(b.tier_hist_BN).sum(0)
  trace_L = np.asarray(b.trace_L)[: int(b.n_loop)]
  return {
    "tiers": tiers.tolist(),
    "tier_hist": hist_N.tolist(),
    "position_offered": [int(hist_N[tiers > j].sum()) for j in range(budget.k_max)],
    "position_reached": np.asarray(b.reached_BJ).sum(0).tolist(),
    "position_accepted": np.asarray(b.accepted_BJ).sum(0).tolist(),
    "k_trace": tiers[trace_L].tolist(),
  }


def summary(c: dict, steps: int, proposed: int, accepted: int) -> dict:
  """The acceptance fields of an auto decode from `counts` (pooled over calls or not) and the
  decode's exact step, proposed and accepted totals.

  The accept histogram pools steps of every tier, so the fields that assume one k are replaced:
  per_position_cond[j] = accepted_j / reached_j, per_position_uncond[j] = accepted_j / the steps
  whose tier offered draft j, alpha = S / (S + F) over the judged drafts (S accepted, F rejected),
  and predicted_tau (Leviathan's, for one fixed k) is NaN.
  """
  reached_J, acc_J = np.asarray(c["position_reached"]), np.asarray(c["position_accepted"])
  s, f = float(acc_J.sum()), float((reached_J - acc_J).sum())
  return {
    "k": "auto",
    "mean_k": proposed / steps if steps else float("nan"),
    "proposed": proposed,
    "accepted": accepted,
    "acceptance_rate": accepted / proposed if proposed else float("nan"),
    "per_position_cond": _ratio(acc_J, reached_J),
    "per_position_uncond": _ratio(acc_J, c["position_offered"]),
    "alpha": s / (s + f) if s + f else float("nan"),
    "predicted_tau": float("nan"),
  }
