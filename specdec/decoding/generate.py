"""`specdec.generate`: validate on the host, prefill once, then run on-device chunks until done.

The host syncs once after the prefill (its time is the TTFT) and once after each chunk of up to
CHUNK_STEPS steps; the device stops a chunk when every row is done, so every arm, drafted or not,
runs the same pattern: host_syncs <= ceil(loop_steps / CHUNK_STEPS) + 1.
"""

import contextlib
import dataclasses
import functools
import inspect
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec import metrics, sharding, xla_env
from specdec.decoding import budget as budget_lib
from specdec.decoding import memory
from specdec.decoding import step_costs as step_costs_lib
from specdec.decoding.accept import Mode, base_mode, validate_mode
from specdec.decoding.compiles import CompileCounter
from specdec.decoding.step import PREFILL_CHUNK, StepConfig, decode_chunk, prefill, prefill_fields
from specdec.decoding.tree import tree as parse_tree
from specdec.drafters.null import null
from specdec.models.config import HybridConfig
from specdec.ops.kv_cache import check_kv_dtype
from specdec.ops.sampling import Sampling

CHUNK_STEPS = 64  # most steps between two host looks (the device stops early when all are done)
MIN_BUCKET = 16
log = logging.getLogger(__name__)


@dataclasses.dataclass
class Generation:
  tokens: list[list[int]]  # generated ids per prompt (EOS included when emitted)
  texts: list[str]
  stats: dict


def prompt_bucket(n: int, min_bucket: int = MIN_BUCKET) -> int:
  """Prompts are padded to power-of-two buckets so a sweep compiles a handful of prefills."""
  return max(min_bucket, 1 << (max(n, 1) - 1).bit_length())


def cache_slots(bucket: int, max_new: int, k: int) -> int:
  return -(-(bucket + max_new + k + 1) // 64) * 64


def check_cache_room(prompt_len: int, max_new_tokens: int, k: int, room: int, what="k+1") -> None:
  """The last verify writes slot prompt + max_new + k: it must fit the model's positions. A tree
  writes its n nodes at consecutive slots, so k is then n - 1 (what: "a tree of n nodes")."""
  need = prompt_len + max_new_tokens + k + 1
  if need > room:
    raise ValueError(
      f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) + {what} ({k + 1}) = "
      f"{need} exceeds the cache room of {room} positions"
    )


def _tree_plan(model, drafter, k, tree, mode):
  """The parsed tree and the k it implies (its depth), refused where a step cannot verify it."""
  t = parse_tree(tree)
  if drafter is None:
    raise ValueError(
      "tree= needs a drafter that drafts trees (ngram, suffix, draft_lm, mtp or eagle3)"
    )
  if k is not None and k != t.depth:
    raise ValueError(f"k={k} disagrees with the tree's depth {t.depth}; leave k out with a tree")
  if isinstance(model.config, HybridConfig):
    raise ValueError(
      f"tree=: a {model.config.model_type} target keeps recurrent state, which a tree verify "
      "would need per node; use a chain (k=) with hybrid targets"
    )
  if mode not in ("greedy", "onehot"):
    raise ValueError(f"tree= supports acceptance 'greedy' or 'onehot', got {mode!r}")
  drafter.validate_tree(t)
  return t, t.depth


def _auto_budget(drafter, k, tree, budget) -> budget_lib.Budget:
  """The budget of k="auto" (chain tiers, default `DEFAULT_TIERS`) or tree="auto" (nested tree
  tiers, default `DEFAULT_TREE_TIERS`), validated."""
  if tree is not None and k is not None:
    raise ValueError(
      f"k={k!r} with tree={tree!r}: tree='auto' chooses among trees (their depths are k), "
      "k='auto' among chains; give one"
    )
  if drafter is None or drafter.name == "null":
    arg = "k='auto'" if tree is None else "tree='auto'"
    raise ValueError(f"{arg} needs a drafter: without drafts there is no budget to choose")
  default = budget_lib.DEFAULT_TIERS if tree is None else budget_lib.DEFAULT_TREE_TIERS
  budget = budget or budget_lib.Budget(tiers=default)
  budget.validate()
  if budget.is_tree != (tree is not None):
    want = "tree='auto'" if budget.is_tree else "k='auto'"
    raise ValueError(f"budget tiers {budget.spec()} run with {want}")
  return budget


def _prompt_ids(model, prompts) -> list[list[int]]:
  if isinstance(prompts, str):
    prompts = [prompts]
  ids = [model.encode(p) if isinstance(p, str) else [int(t) for t in p] for p in prompts]
  for i, p in enumerate(ids):
    if not p:
      raise ValueError(f"prompt {i} is empty")
    if max(p) >= model.config.vocab_size or min(p) < 0:
      raise ValueError(f"prompt {i} has token ids outside [0, {model.config.vocab_size})")
  return ids


@dataclasses.dataclass(frozen=True)
class _Plan:
  """What generate runs, fixed before anything compiles: the step, the shapes, the inputs."""

  sc: StepConfig  # at k="auto" or tree="auto", the largest tier's
  mode: Mode  # as asked; sc.mode is the compiled one (`reject` runs as a flag, accept.base_mode)
  ids: list
  bucket: int
  slots: int
  budget: budget_lib.Budget | None  # k="auto" or tree="auto": its tiers; None: sc's k or tree

  @property
  def batch(self) -> int:
    return len(self.ids)


def _plan(
  model, prompts, max_new_tokens, temperature, top_k, top_p, drafter, k, acceptance, max_slots,
  min_bucket, kv_dtype, memory_fraction, prefill_chunk, tree=None, budget=None,
) -> _Plan:  # fmt: skip
  """generate's checks and static choices, all on the host (see generate for the arguments)."""
  sampling = Sampling(float(temperature), top_k, float(top_p))
  sampling.validate()
  mode = acceptance or ("greedy" if sampling.greedy else "onehot")
  validate_mode(mode, sampling)
  auto = k == "auto" or (isinstance(tree, str) and tree == "auto")
  if auto:
    budget = _auto_budget(drafter, k, tree, budget)
    k = budget.k_max
    if budget.is_tree:  # each tier refused as a fixed tree would be; sc runs the largest
      for t in budget.tiers:
        tree, k = _tree_plan(model, drafter, None, t, base_mode(mode, sampling))
  elif budget is not None:
    raise ValueError(f"budget= chooses the tiers of k='auto' or tree='auto', got k={k!r}")
  elif tree is not None:
    tree, k = _tree_plan(model, drafter, k, tree, base_mode(mode, sampling))
  if drafter is None:
    drafter, k = null(), 0 if k is None else k
  k = 4 if k is None else k
  if not isinstance(k, int) or k < 0 or (k == 0 and drafter.name != "null"):
    raise ValueError(f"k must be an integer >= 1 with a drafter, or 'auto', got k={k!r}")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")

  ids = _prompt_ids(model, prompts)
  B, longest = len(ids), max(len(p) for p in ids)
  bucket = prompt_bucket(longest, min_bucket)
  width = k if tree is None else tree.size - 1  # slots a verify writes after the newest token
  slots = cache_slots(bucket, max_new_tokens, width)
  room = max_slots or model.config.max_position_embeddings
  what = "k+1" if tree is None else f"a tree of {tree.size} nodes"
  try:
    check_cache_room(longest, max_new_tokens, width, room, what)
  except ValueError as e:
    if not auto:
      raise
    raise ValueError(
      f"{budget.arg}: the largest budget tier, {budget.label(-1)}, does not fit: {e}"
    ) from None
  for tier_k in budget.depths if auto else (k,):
    drafter.validate(model.config, tier_k, slots)
  kv_dtype = model.kv_dtype if kv_dtype is None else check_kv_dtype(kv_dtype)
  memory.check_fits(model, drafter, k, B, bucket, slots, kv_dtype, memory_fraction)

  eos = tuple(model.config.eos_token_ids)
  if prefill_chunk < 1 or prefill_chunk & (prefill_chunk - 1):
    raise ValueError(f"prefill_chunk must be a power of two, got {prefill_chunk}")
  sc = StepConfig(
    model.config, model.dtype, drafter, k, sampling, base_mode(mode, sampling), eos, kv_dtype,
    prefill_chunk, tree,
  )  # fmt: skip
  return _Plan(sc, mode, ids, bucket, slots, budget if auto else None)


def _abstract_state(model, plan: _Plan, mesh=None):
  """The decode state's shapes and dtypes, as the chunk receives it (traced, not compiled);
  under a mesh, with the shardings `generate` gives its inputs (replicated) and state."""
  sc, B = plan.sc, plan.batch
  whole = sharding.replicated(mesh) if mesh else None
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=whole)  # noqa: E731
  key = jax.eval_shape(lambda: jax.random.key(0))
  key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=whole)
  inputs = (model.params, sc.drafter.params, i32(B, plan.bucket), i32(B), i32(B), key)
  st = jax.eval_shape(functools.partial(prefill, sc=sc, slots=plan.slots), *inputs)
  if mesh is not None:
    on = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)  # noqa: E731
    st = jax.tree.map(on, st, sharding.decode_state_shardings(st, mesh))
  if plan.budget:
    b = budget_lib.init_state(B, plan.budget, plan.slots)
    as_arg = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=whole)  # noqa: E731
    st = st.replace(budget=jax.tree.map(as_arg, b))
    budget_lib.check_tier_shapes(model.params, sc.drafter.params, st, sc, plan.budget)
  return inputs, st


def _auto_costs(model, plan: _Plan, step_costs, context: int, mesh) -> np.ndarray:
  """The cost curve of an auto decode: given, or measured for its shapes and mesh (cached on
  disk)."""
  with jax.set_mesh(mesh) if mesh else contextlib.nullcontext():
    _abstract_state(model, plan, mesh)  # a drafter whose state changes with k is refused first
  if step_costs is None:
    sc = plan.sc
    step_costs = step_costs_lib.cost_curve(
      model, sc.drafter, plan.budget, plan.batch, plan.slots, context, sc.kv_dtype, mesh=mesh
    )  # fmt: skip
  costs = plan.budget.check_costs(step_costs)
  return jax.device_put(costs, sharding.replicated(mesh) if mesh else None)


def generate(
  model,
  prompts,
  max_new_tokens: int = 64,
  temperature: float = 0.0,
  top_k: int = 0,
  top_p: float = 1.0,
  seed: int = 0,
  drafter=None,
  k: int | str | None = None,
  acceptance: Mode | None = None,
  max_slots: int | None = None,
  min_bucket: int = MIN_BUCKET,
  kv_dtype=None,
  memory_fraction: float | None = memory.DEFAULT_FRACTION,
  prefill_chunk: int = PREFILL_CHUNK,
  mesh=None,
  tree=None,
  budget: budget_lib.Budget | None = None,
  step_costs=None,
) -> Generation:
  """Generates from `prompts` (strings or token-id lists) with optional speculative drafting.

  drafter=None is plain autoregressive decoding (k = 0). With a drafter, k (default 4) drafts are
  verified per target forward. acceptance: 'greedy' (temperature 0 only), 'onehot' (the default
  under sampling), 'fullq', or 'reject' (the same-shape baseline). Sampling transforms apply in the
  order temperature, top-k, top-p (see specdec.ops.sampling).
  The prompt is padded to a power-of-two bucket >= min_bucket (a sweep fixes one bucket so cells
  share compiled executables).
  kv_dtype: the target's KV cache (float32, bfloat16, float16 or float8_e4m3fn); None is the model's
  `kv_dtype` (FP8 for a checkpoint that declares an FP8 KV cache), else its dtype. An FP8 cache uses
  the model's per-layer k/v scales, 1.0 where it has none (`Model.with_fp8_kv` sets them).
  memory_fraction: the share of the device's memory limit that the resident params plus the decode
  state may fill; a batch and context that do not fit raise specdec.MemoryPlanError before
  anything compiles (None: no check; skipped where the backend keeps no memory stats, e.g. CPU).
  prefill_chunk: prompts longer than this go through the target in slices of it (a power of two),
  which bounds the prefill's attention scores; the result is the same forward.
  mesh: a `specdec.sharding.make_mesh` mesh: the target's params are placed on it (as
  `specdec.load(..., mesh=)` places them; no copy if they already are) and the same step runs
  partitioned over it; the drafter stays replicated.
  tree: a static draft tree to verify each step instead of a chain, as PATHS of child ranks
  (vLLM's `speculative_token_tree`, e.g. [(0,), (1,), (0, 0)]; specdec.decoding.tree); k is its
  depth (leave k out or give the same). Acceptance greedy or onehot (multi-draft recursive
  rejection sampling, docs/design.md "Trees"); the drafter must draft trees (ngram, suffix,
  draft_lm, mtp, eagle3); dense targets only.
  k="auto" chooses among the tiers of `budget` (default `budget.Budget()`: k in 1, 2, 4, 8) on the
  device before every step, by expected tokens per second (docs/design.md, "Adaptive budget").
  tree="auto" does the same among nested trees (leave k out): `budget.Budget(tiers=(PATHS, ...))`,
  each tier's paths a subset of the next's, default `budget.DEFAULT_TREE_TIERS` (the breadth-first
  binary trees of 2, 4, 8 and 16 drafted nodes). Stats name a tier by its drafted tokens per step
  (`tiers`, `k_trace`), a tree tier's PATHS in `tier_trees`.
  step_costs: the seconds a step takes at each tier; None measures them on this device (once per
  conditions; `step_costs.cost_curve` caches them on disk, before the decode's clock starts).
  """
  if mesh is not None:
    model = sharding.on_mesh(model, mesh)
  plan = _plan(
    model, prompts, max_new_tokens, temperature, top_k, top_p, drafter, k, acceptance, max_slots,
    min_bucket, kv_dtype, memory_fraction, prefill_chunk, tree, budget,
  )  # fmt: skip
  sc, ids, bucket, slots, B = plan.sc, plan.ids, plan.bucket, plan.slots, plan.batch
  drafter, k, mode = sc.drafter, sc.k, plan.mode
  prompt_BT = np.zeros((B, bucket), np.int32)
  for i, p in enumerate(ids):
    prompt_BT[i, : len(p)] = p
  lengths_B = jnp.asarray([len(p) for p in ids], jnp.int32)
  max_new_B = jnp.full((B,), max_new_tokens, jnp.int32)
  if mesh is not None:  # every host input replicated over the mesh, as `lower_ahead` lowers it
    lengths_B, max_new_B = jax.device_put((lengths_B, max_new_B), sharding.replicated(mesh))
  xla_env.enable_compile_cache()
  if plan.budget:
    costs_N = _auto_costs(model, plan, step_costs, max(len(p) for p in ids), mesh)
  t0 = time.perf_counter()
  with CompileCounter() as built, jax.set_mesh(mesh) if mesh else contextlib.nullcontext():
    st = prefill(
      model.params,
      drafter.params,
      jnp.asarray(prompt_BT),  # made under the mesh (if any), hence replicated over it
      lengths_B,
      max_new_B,
      jax.random.key(seed),
      sc,
      slots,
      reject=mode == "reject",
    )
    if mesh is not None:
      st = jax.device_put(st, sharding.decode_state_shardings(st, mesh))
    if plan.budget:
      b = budget_lib.init_state(B, plan.budget, slots)
      st = st.replace(budget=jax.device_put(b, sharding.replicated(mesh) if mesh else None))
    done = np.asarray(st.done)
    t1 = time.perf_counter()
    host_syncs = 1
    while not done.all():
      if plan.budget:
        st = budget_lib.decode_chunk(
          model.params, drafter.params, st, costs_N, sc, plan.budget, CHUNK_STEPS
        )
      else:
        st = decode_chunk(model.params, drafter.params, st, sc, CHUNK_STEPS)
      done = np.asarray(st.done)
      host_syncs += 1
    t2 = time.perf_counter()
  if built.count:
    log.info(
      "specdec.generate compiled %d executable(s) in %.1f s (prefill of a %d-token bucket and "
      "the %s k=%s step at batch %d, %d slots); later calls of these shapes reuse them",
      built.count, built.seconds, bucket, drafter.name, "auto" if plan.budget else k, B, slots,
    )  # fmt: skip

  tokens_np, lengths_np = np.asarray(st.tokens), np.asarray(st.lengths)
  out = [tokens_np[i, len(p) : lengths_np[i]].tolist() for i, p in enumerate(ids)]
  counts = {
    name: np.asarray(getattr(st, name))
    for name in ("steps", "proposed", "accepted", *metrics.COUNTS)
  }
  steps_B = counts["steps"]
  loop_steps = int(steps_B.max())
  # Every step costs the batch the same (fixed shapes), so a row that stopped after steps_B[i] of
  # the loop's loop_steps steps finished that share of the way through the decode wall time.
  share_B = steps_B / loop_steps if loop_steps else np.zeros(B)
  finish_s = (t1 - t0) + (t2 - t1) * share_B
  tree_stat = None if sc.tree is None else [list(p) for p in sc.tree.paths]
  if plan.budget and plan.budget.is_tree:
    tree_stat = "auto"
  stats = {
    "method": drafter.name,
    "k": k,
    "tree": tree_stat,
    "verify_width": k + 1 if sc.tree is None else sc.tree.size,  # the largest tier's under auto
    "acceptance": mode,
    "batch": B,
    "prompt_tokens": [len(p) for p in ids],
    "tokens_out": [len(o) for o in out],
    # Per-sequence counters; the top-level acceptance fields pool them over rows.
    "rows": {name: v.tolist() for name, v in counts.items()}
    | {"emitted": counts["emitted_by_bucket"].sum(-1).tolist()},
    **metrics.acceptance_summary(
      counts["accept_hist"].sum(0),
      counts["censored_hist"].sum(0),
      counts["emitted_by_bucket"].sum(0),
    ),  # fmt: skip
    "accept_hist": counts["accept_hist"].sum(0).tolist(),
    "censored_hist": counts["censored_hist"].sum(0).tolist(),
    "emitted_by_bucket": counts["emitted_by_bucket"].sum(0).tolist(),
    "start_s": t0,  # host perf_counter when generate began; finish_s counts from it
    "prefill_s": t1 - t0,
    "decode_s": t2 - t1,
    "finish_s": finish_s.tolist(),
    "loop_steps": loop_steps,
    "host_syncs": host_syncs,
    "chunk_steps": CHUNK_STEPS,
    "compiles": built.count,
    "compile_s": built.seconds,
  }
  if plan.budget:
    b = jax.device_get(st.budget)
    stats["rows"]["tier_hist"] = np.asarray(b.tier_hist_BN).tolist()
    total = lambda name: int(counts[name].sum())  # noqa: E731
    stats |= budget_lib.counts(b, plan.budget)
    stats |= budget_lib.summary(stats, total("steps"), total("proposed"), total("accepted"))
  return Generation(tokens=out, texts=[model.decode(o) for o in out], stats=stats)


def lower_ahead(model, prompts, max_new_tokens: int = 64, **kw) -> list:
  """The prefill and decode chunk that `generate(model, prompts, max_new_tokens, **kw)` runs,
  traced and lowered (jax `Lowered`s), not yet compiled. Lowering is Python under the GIL and,
  for Pallas Mosaic GPU kernels, depends on what this process lowered before (their module text
  differs with the order), so a sweep lowers every cell in one fixed order on one thread (the
  same HLO, hence the same persistent-cache keys, in every run) and compiles them in parallel."""
  args = inspect.signature(generate).bind(model, prompts, max_new_tokens, **kw)
  args.apply_defaults()
  args.arguments.pop("seed")  # a traced value: every seed shares the executables
  args.arguments.pop("step_costs")  # a traced value too: lowered by its shape
  mesh = args.arguments.pop("mesh")
  if mesh is not None:
    model = args.arguments["model"] = sharding.on_mesh(model, mesh)
  xla_env.enable_compile_cache()
  plan = _plan(**args.arguments)
  sc = plan.sc
  with jax.set_mesh(mesh) if mesh else contextlib.nullcontext():
    inputs, st = _abstract_state(model, plan, mesh)
    if plan.budget:
      whole = sharding.replicated(mesh) if mesh else None
      costs_N = jax.ShapeDtypeStruct((len(plan.budget.tiers),), jnp.float32, sharding=whole)
      chunk = budget_lib.decode_chunk.lower(
        model.params, sc.drafter.params, st, costs_N, sc, plan.budget, CHUNK_STEPS
      )  # fmt: skip
    else:
      chunk = decode_chunk.lower(model.params, sc.drafter.params, st, sc, CHUNK_STEPS)
    return [prefill_fields.lower(*inputs, sc.for_prefill, plan.slots), chunk]


def compile_lowered(lowered) -> CompileCounter:
  """Compiles one `Lowered` in this thread (XLA releases the GIL); later calls of its shapes run
  the executable. Returns what was built: 1, a compile or a load from the persistent cache."""
  with CompileCounter() as built:
    lowered.compile()
  return built


def compile_ahead(model, prompts, max_new_tokens: int = 64, **kw) -> CompileCounter:
  """Compiles what `generate(model, prompts, max_new_tokens, **kw)` runs, without running it;
  returns what was built (count, of which hits came from the persistent cache, and seconds)."""
  with CompileCounter() as built:
    for lowered in lower_ahead(model, prompts, max_new_tokens, **kw):
      lowered.compile()
  return built
