"""k="auto" and tree="auto": a goodput-optimal draft budget chosen on the device before every step.

A `Budget` names a few tiers: draft lengths k_1 < ... < k_N (chains, k="auto") or static trees,
each tier's nodes a subset of the next's (tree="auto"). Each tier is the existing `step` at its
k or tree; `decode_chunk` runs them under one `jax.lax.switch` inside the chunk's on-device loop,
so all tiers live in one executable and choosing one never involves the host. The state is shaped
for the largest tier (a step of a smaller one writes fewer of its entries).

The estimator treats a chain of k as the tree of k rank-0 nodes, so one code path serves both.
alpha_bjr estimates, in row b, P(the rank-r child at depth j+1 is accepted | its parent is),
and before each step the tier maximising the batch's goodput is chosen:

  E_b(tier) = 1 + sum over the tier's nodes of prod_{(j, r) on the node's path} alpha_bjr
  tier      = argmax_n  sum_{running b} E_b(n) / t_step(n)

E is the expected emitted tokens: at most one child of a node is accepted (greedy takes one path,
the onehot walk stops at the first accepted child), so the accepted nodes form one path and the
accepted depth is the number of accepted nodes, whose mean is the sum of each node's probability
of acceptance, the product of the conditionals along its path. For a chain, E_b(k) = 1 + sum_{i<k}
prod_{j<=i} alpha_bj0. t_step is the cost curve (an array argument: `step_costs.py` measures and
caches it). One switch serves the whole batch, so the choice is the batch's, not a row's. See
docs/design.md, "Adaptive budget".

Tree tiers must nest: every tier's nodes are then nodes of the largest tree, which gives them one
node numbering. One survival pass over the largest tree serves every tier's E, an estimate a
small tier learns is about nodes every larger tier drafts too, and E grows with the tier, so the
choice is a plain trade of expected tokens against step time.

Sampling stays lossless: the choice depends only on earlier steps, and each tier runs a lossless
tree or chain step (the tree step's statistical test in tests/decoding/test_tree.py covers it).

Shapes: B rows, J = K depths (draft positions; K the deepest tier's depth), o child ranks (the
widest tier's; 1 for chains), n nodes of the largest tier with the root, N tiers, L loop steps of
the trace (the state's slots S: a step of a running row emits at least one token, so a decode
takes fewer steps than slots), T = K + 1 entries of an accepted path.
"""

import dataclasses
import functools
import itertools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec.decoding.state import DecodeState
from specdec.decoding.step import StepConfig, step, step_path
from specdec.decoding.tree import Tree, binary_paths, tree

DEFAULT_TIERS = (1, 2, 4, 8)
# tree="auto": the breadth-first binary trees (each node's top-2 children, `tree.binary_paths`) of
# 2, 4, 8 and 16 drafted nodes, depths 1 to 4: each is the one before grown breadth-first, so they
# nest. Shallower than the chains: a drafter right most of the time gains from a deeper family.
DEFAULT_TREE_TIERS = tuple(tree(binary_paths(n + 1)) for n in (2, 4, 8, 16))


def _parse_tier(i: int, t):
  """A tier given as PATHS, as a `Tree` (hashable: a budget is a static argument)."""
  if not isinstance(t, list | tuple):
    return t
  try:
    return tree(t)
  except ValueError as e:
    raise ValueError(f"budget tiers[{i}]: {e}") from None


@dataclasses.dataclass(frozen=True)
class Budget:
  """The static side of k="auto" and tree="auto": the tiers and the estimator's constants.

  tiers: increasing draft lengths (chains), or trees (`Tree`s or PATHS, parsed here), each tier's
  paths a strict subset of the next's."""

  tiers: tuple[int, ...] | tuple[Tree, ...] = DEFAULT_TIERS
  # EMA weight of the old estimate per observation: an estimate forgets an observation after
  # about 1 / (1 - decay) = 8 steps, quick enough to follow acceptance along a request, slow
  # enough that one lucky step does not flip the tier (the estimate's std at alpha = 0.5 is 0.13).
  decay: float = 0.875
  prior: float = 0.5  # alpha before any observation: no preference between accepting or not

  def __post_init__(self):
    object.__setattr__(self, "tiers", tuple(_parse_tier(i, t) for i, t in enumerate(self.tiers)))

  @property
  def is_tree(self) -> bool:
    return bool(self.tiers) and all(isinstance(t, Tree) for t in self.tiers)

  @property
  def arg(self) -> str:
    """The generate argument that runs this budget."""
    return "tree='auto'" if self.is_tree else "k='auto'"

  @functools.cached_property
  def shapes(self) -> tuple[Tree, ...]:
    """Every tier as a tree: a chain of k is the tree of k rank-0 nodes."""
    if self.is_tree:
      return self.tiers
    return tuple(tree([(0,) * d for d in range(1, k + 1)], max_nodes=k) for k in self.tiers)

  @property
  def depths(self) -> list[int]:
    """Each tier's k: its chain length or its tree's depth."""
    return [t.depth for t in self.shapes]

  @property
  def sizes(self) -> list[int]:
    """Each tier's drafted tokens per step: its k, or its tree's nodes without the root."""
    return [t.size - 1 for t in self.shapes]

  @property
  def k_max(self) -> int:
    return max(self.depths)

  def label(self, i: int) -> str:
    return f"k={self.tiers[i]}" if not self.is_tree else f"tiers[{i}] ({self.sizes[i]} nodes)"

  def spec(self) -> list:
    """The tiers as JSON values: draft lengths, or each tree's PATHS."""
    return [[list(p) for p in t.paths] if isinstance(t, Tree) else t for t in self.tiers]

  def validate(self) -> None:
    t = self.tiers
    if self.is_tree:
      self._validate_nesting()
    elif not t or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in t):
      raise ValueError(
        f"budget tiers must be integers >= 1 (chains) or trees (tree='auto'), got tiers={t!r}"
      )
    elif list(t) != sorted(set(t)):
      raise ValueError(f"budget tiers must be strictly increasing, got tiers={t!r}")
    if not 0.0 <= self.decay < 1.0:
      raise ValueError(f"budget decay must be in [0, 1), got decay={self.decay}")
    if not 0.0 <= self.prior <= 1.0:
      raise ValueError(f"budget prior must be in [0, 1], got prior={self.prior}")

  def _validate_nesting(self) -> None:
    for i, (small, big) in enumerate(itertools.pairwise(self.tiers)):
      missing = sorted(set(small.paths) - set(big.paths), key=lambda p: (len(p), p))
      if missing:
        raise ValueError(
          f"budget tiers[{i}] is not nested in tiers[{i + 1}]: its path {missing[0]} is not "
          "there (each tree tier's paths must be a subset of the next's)"
        )
      if small.size == big.size:
        raise ValueError(f"budget tiers[{i + 1}] adds no node to tiers[{i}]; tiers must grow")

  def check_costs(self, costs) -> np.ndarray:
    """The cost curve as an array, one positive finite seconds-per-step figure per tier."""
    c = np.asarray(costs, np.float64)
    if c.shape != (len(self.tiers),) or not np.all(np.isfinite(c) & (c > 0)):
      raise ValueError(
        f"step_costs must be {len(self.tiers)} positive finite step times, one per tier "
        f"{self.spec()}, got {costs!r}"
      )
    return c.astype(np.float32)

  # --- the tiers as sets of the largest tier's nodes (numbered as in it), for the estimator ---

  @functools.cached_property
  def index_in_largest(self) -> tuple[np.ndarray, ...]:
    """Per tier, [its n nodes]: each node's number in the largest tier (the root is 0)."""
    index = {p: i for i, p in enumerate(self.shapes[-1].paths, 1)}
    return tuple(np.asarray([0] + [index[p] for p in t.paths], np.int32) for t in self.shapes)

  @functools.cached_property
  def member_Nn(self) -> np.ndarray:
    """[N, n] bool: the largest tier's node i is in tier n."""
    out = np.zeros((len(self.tiers), self.shapes[-1].size), bool)
    for i, nodes in enumerate(self.index_in_largest):
      out[i, nodes] = True
    return out

  @functools.cached_property
  def rank_n(self) -> np.ndarray:
    """[n] int32: each node's child rank (the root's 0)."""
    return np.asarray([0] + [p[-1] for p in self.shapes[-1].paths], np.int32)

  @functools.cached_property
  def kids_Nn(self) -> np.ndarray:
    """[N, n] int32: how many children node i has in tier n."""
    parents = self.shapes[-1].parents
    out = np.zeros(self.member_Nn.shape, np.int32)
    for i in range(len(self.tiers)):
      np.add.at(out[i], parents[1:], self.member_Nn[i, 1:])
    return out

  @functools.cached_property
  def width_NJ(self) -> np.ndarray:
    """[N, J] int32: the child ranks tier n drafts at depth j+1 (0 .. width-1; 0 past its depth)."""
    depths_n = self.shapes[-1].depths
    out = np.zeros((len(self.tiers), self.k_max), np.int32)
    for i in range(len(self.tiers)):
      for node in np.flatnonzero(self.member_Nn[i])[1:]:
        j = depths_n[node] - 1
        out[i, j] = max(out[i, j], self.rank_n[node] + 1)
    return out


@flax.struct.dataclass
class BudgetState:
  """The estimator and what the choices were; lives in `DecodeState.budget`."""

  alpha_BJo: jax.Array  # [B, J, o] f32: P(the rank-r child at depth j+1 accepted | its parent)
  reached_BJ: jax.Array  # [B, J] int32: steps that judged a draft at depth j+1
  accepted_BJ: jax.Array  # [B, J] int32: of those, the steps that accepted one
  tier_hist_BN: jax.Array  # [B, N] int32: steps a running row took at each tier
  trace_L: jax.Array  # [L] int32: the tier index of loop step l, -1 past the last
  n_loop: jax.Array  # [] int32: loop steps taken (trace entries written)


def init_state(B: int, budget: Budget, slots: int) -> BudgetState:
  """The estimator at its prior and every count at zero, as host arrays (each its own buffer:
  the state is donated)."""
  J, N = budget.k_max, len(budget.tiers)
  o = budget.shapes[-1].children.shape[1]
  return BudgetState(
    alpha_BJo=np.full((B, J, o), budget.prior, np.float32),
    reached_BJ=np.zeros((B, J), np.int32),
    accepted_BJ=np.zeros((B, J), np.int32),
    tier_hist_BN=np.zeros((B, N), np.int32),
    trace_L=np.full((slots,), -1, np.int32),
    n_loop=np.zeros((), np.int32),
  )


def expected_tokens(alpha_BJo, budget: Budget):
  """E_b for every tier: [B, J, o] conditional acceptance -> [B, N] expected emitted tokens."""
  largest = budget.shapes[-1]
  # P(node accepted) over the largest tier's nodes, parents before children (node order).
  surv_Bn = jnp.ones(alpha_BJo.shape[:1] + (largest.size,), alpha_BJo.dtype)
  for d in range(1, largest.depth + 1):
    nodes = largest.at_depth(d)
    alpha_Bm = alpha_BJo[:, d - 1, budget.rank_n[nodes]]
    surv_Bn = surv_Bn.at[:, nodes].set(surv_Bn[:, largest.parents[nodes]] * alpha_Bm)
  member_Nn = jnp.asarray(budget.member_Nn[:, 1:], alpha_BJo.dtype)
  return 1.0 + jnp.sum(surv_Bn[:, None, 1:] * member_Nn[None], -1)


def choose(alpha_BJo, running_B, costs_N, budget: Budget):
  """The tier index maximising the running rows' summed expected tokens per second."""
  e_BN = expected_tokens(alpha_BJo, budget)
  goodput_N = jnp.sum(jnp.where(running_B[:, None], e_BN, 0.0), 0) / costs_N
  return jnp.argmax(goodput_N).astype(jnp.int32)


def observe(b: BudgetState, tier, running_B, n_acc_B, path_BT, budget: Budget) -> BudgetState:
  """The estimator and counts after one step at tier index `tier` (traced), whose accepted path
  is path_BT ([B, T]: the largest tier's node numbers, `step_path`).

  A running row judged the tier's children of its accepted node at each depth j <= n_acc (a
  chain's draft j+1 while j < k) and accepted the ranks on its path: those (depth, rank) pairs
  move by the EMA toward what was seen. The rest move toward a reference: at a judged depth,
  ranks past the tier's widest toward that widest one; at every depth past the deepest judged
  one (not drafted, or not reached), each rank toward the same rank there. For a chain that is
  Leviathan's geometric assumption, a constant conditional rate beyond what was seen: a small
  tier does not freeze the estimates that would justify a larger one, and after acceptance drops
  the deep rates follow the shallow ones instead of keeping the old phase's. Both moves weigh
  more while a depth has been judged fewer than about 1 / (1 - decay) times (a running mean with
  the prior as one sample, counted per depth), so a decode leaves the prior within a few steps.
  """
  _, J, o = b.alpha_BJo.shape
  j_J, r_o = jnp.arange(J), jnp.arange(o)
  kids_BJ = jnp.asarray(budget.kids_Nn)[tier][path_BT[:, :J]]
  rank_BJ = jnp.asarray(budget.rank_n)[path_BT[:, 1:]]
  reached_BJ = running_B[:, None] & (j_J[None, :] <= n_acc_B[:, None]) & (kids_BJ > 0)
  hit_BJ = reached_BJ & (j_J[None, :] < n_acc_B[:, None])
  judged_BJo = reached_BJ[..., None] & (r_o < kids_BJ[..., None])
  hit_BJo = hit_BJ[..., None] & (r_o == rank_BJ[..., None])
  d = budget.decay
  # A depth's n-th judgement weighs 1 / (n + 1), as in a mean that counts the prior as one sample,
  # until that falls to the EMA's 1 - d: the first steps do not linger at the prior.
  w_BJ1 = jnp.maximum(1 - d, 1.0 / (b.reached_BJ + 2))[..., None]
  alpha_BJo = jnp.where(judged_BJo, (1 - w_BJ1) * b.alpha_BJo + w_BJ1 * hit_BJo, b.alpha_BJo)
  pull = lambda a, where_BJo, ref: jnp.where(where_BJo, (1 - w_BJ1) * a + w_BJ1 * ref, a)  # noqa: E731
  width_J = jnp.asarray(budget.width_NJ)[tier]
  widest_BJ1 = jnp.take_along_axis(alpha_BJo, jnp.maximum(width_J - 1, 0)[None, :, None], 2)
  wider_Jo = r_o[None, :] >= width_J[:, None]
  alpha_BJo = pull(alpha_BJo, reached_BJ[..., None] & wider_Jo[None], widest_BJ1)
  deepest_B = jnp.sum(reached_BJ, 1) - 1  # reached depths are a prefix; a running row has one
  deepest_B1o = jnp.take_along_axis(alpha_BJo, jnp.maximum(deepest_B, 0)[:, None, None], 1)
  deeper_BJ = running_B[:, None] & (j_J[None, :] > deepest_B[:, None])
  alpha_BJo = pull(alpha_BJo, deeper_BJ[..., None], deepest_B1o)
  one_B = running_B.astype(jnp.int32)
  return b.replace(
    alpha_BJo=alpha_BJo,
    reached_BJ=b.reached_BJ + reached_BJ,
    accepted_BJ=b.accepted_BJ + hit_BJ,
    tier_hist_BN=b.tier_hist_BN.at[:, tier].add(one_B),
    trace_L=b.trace_L.at[b.n_loop].set(tier, mode="drop"),
    n_loop=b.n_loop + 1,
  )


def tier_configs(sc: StepConfig, budget: Budget) -> list[StepConfig]:
  if budget.is_tree:
    return [dataclasses.replace(sc, k=t.depth, tree=t) for t in budget.tiers]
  return [dataclasses.replace(sc, k=k) for k in budget.tiers]


def _tier_step(params, draft_params, st, sc, index_n, T):
  """One tier's step and its accepted path in the largest tier's node numbers, T entries."""
  new, path_BT = step_path(params, draft_params, st, sc)
  path_BT = jnp.asarray(index_n)[path_BT]
  return new, jnp.pad(path_BT, ((0, 0), (0, T - path_BT.shape[1])), mode="edge")


def auto_step(params, draft_params, st: DecodeState, costs_N, sc: StepConfig, budget: Budget):
  """Chooses a tier from the state's estimates, runs its step, updates the estimates."""
  running_B = ~st.done
  tier = choose(st.budget.alpha_BJo, running_B, costs_N, budget)
  branches = [
    functools.partial(_tier_step, sc=c, index_n=index_n, T=budget.k_max + 1)
    for c, index_n in zip(tier_configs(sc, budget), budget.index_in_largest, strict=True)
  ]
  new, path_BT = jax.lax.switch(tier, branches, params, draft_params, st)
  n_acc_B = new.accepted - st.accepted  # done rows add nothing
  return new.replace(budget=observe(st.budget, tier, running_B, n_acc_B, path_BT, budget))


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
  needs one state type): a drafter whose state depends on k or the tree cannot run auto. Traces
  only (`jax.eval_shape` on abstract values), nothing compiles."""
  want, want_def = jax.tree_util.tree_flatten_with_path(jax.eval_shape(lambda s: s, st))
  fixed = "a fixed tree" if budget.is_tree else "a fixed k"
  for i, c in enumerate(tier_configs(sc, budget)):
    out = jax.eval_shape(functools.partial(step, sc=c), params, draft_params, st)
    got, got_def = jax.tree_util.tree_flatten_with_path(out)
    if got_def != want_def:
      raise ValueError(
        f"{budget.arg}: a {budget.label(i)} step returns the {sc.drafter.name} drafter's state "
        f"in another structure than it takes; use {fixed} with this drafter"
      )
    for (path, w), (_, g) in zip(want, got, strict=True):
      if (w.shape, w.dtype) != (g.shape, g.dtype):
        raise ValueError(
          f"{budget.arg}: the {sc.drafter.name} drafter's state differs between tiers "
          f"(state{jax.tree_util.keystr(path)} enters a {budget.label(i)} step as {w.shape} "
          f"{w.dtype} and leaves it as {g.shape} {g.dtype}); use {fixed} with this drafter"
        )


def _ratio(num, den) -> list[float]:
  num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
  return np.where(den > 0, num / np.maximum(den, 1), np.nan).tolist()


COUNT_FIELDS = ("tier_hist", "position_offered", "position_reached", "position_accepted")


def counts(b: BudgetState, budget: Budget) -> dict:
  """The host copy of an auto decode's counts, summed over rows: steps per tier, and per draft
  position (a tree's depth) the steps whose tier offered it, that judged it, that accepted it;
  plus each loop step's tier in order (`k_trace`). A tier is named by the tokens it drafts per
  step (`tiers`: k, or a tree's nodes); tree tiers add their PATHS (`tier_trees`)."""
  sizes_N, depths_N = np.asarray(budget.sizes), np.asarray(budget.depths)
  hist_N = np.asarray(b.tier_hist_BN).sum(0)
  trace_L = np.asarray(b.trace_L)[: int(b.n_loop)]
  out = {
    "tiers": sizes_N.tolist(),
    "tier_hist": hist_N.tolist(),
    "position_offered": [int(hist_N[depths_N > j].sum()) for j in range(budget.k_max)],
    "position_reached": np.asarray(b.reached_BJ).sum(0).tolist(),
    "position_accepted": np.asarray(b.accepted_BJ).sum(0).tolist(),
    "k_trace": sizes_N[trace_L].tolist(),
  }
  return out | ({"tier_trees": budget.spec()} if budget.is_tree else {})


def summary(c: dict, steps: int, proposed: int, accepted: int) -> dict:
  """The acceptance fields of an auto decode from `counts` (pooled over calls or not) and the
  decode's exact step, proposed and accepted totals.

  The accept histogram pools steps of every tier, so the fields that assume one k are replaced:
  per_position_cond[j] = accepted_j / reached_j, per_position_uncond[j] = accepted_j / the steps
  whose tier offered draft j, alpha = S / (S + F) over the judged positions (S accepted, F
  rejected), and predicted_tau (Leviathan's, for one fixed k) is NaN. mean_k is proposed per step
  (a tree step proposes its depth, as a fixed tree's does).
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
