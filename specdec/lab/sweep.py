"""The sweep: the product of a config's axes, run as interleaved legs, one result row per
(cell, leg), appended atomically so a killed sweep resumes where it stopped.

Legs: every cell runs once per leg, and a leg visits all cells before the next leg starts (arms
interleaved A, B, A, B). Within a (cell, leg) the requests run one batch after another; the first
batch (cell.batch requests, which decode together and share its compiles) is the warm-up and is
left out of every timing. Leg l substitutes one prompt token by repetition l, so a copying drafter
cannot draft from memory of the previous leg. Sampled cells also run once per `config.seeds`
entry (the Cell's sample_seed); greedy cells, which no seed changes, run the first only. Each
static tree of `config.trees` (specdec/lab/trees.py) is a cell of every drafted method beside its
chains (the Cell's tree, k its depth), verified by generate(tree=).

Workloads: every prompt of a workload is one request. A multi-turn record (MT-Bench style) gives one
request per user turn, its prompt the earlier turns each followed by the target's own answer: that
turn's greedy continuation by the target as loaded, no drafter (Runner._answer). The answers are
made once, before any cell runs, so every arm and leg reads the same prompt for a later turn and
the comparison stays paired, whatever the cell's sampling; at T = 0 they are what the gate-checked
no-draft arm emits for that turn. A document workload (`workload.SOURCE_WORKLOAD`) cuts each
document to its first prompt_tokens tokens; other prompts are extended to prompt_tokens with real
text in front (`workload.source_filler`).

Every row keeps its requests one by one (`requests`: timing, counts, tau and acceptance of each,
and whether it was timed), so tables can put bootstrap intervals over requests beside the pooled
figures, and the host round trips of its timed generate calls (`host_syncs`, `loop_steps`; per
call in extra["calls"]).

The gate: greedy output of every drafted cell must be token-identical to the no-draft arm on the
same prompts and leg (compared by a hash of the outputs stored in each row); a sampled cell gets a
separate greedy check of the same drafter. Its speed is admissible only where the gate passed.
In 16-bit compute a verify of width k+1 may round a near-tie differently from a width-1 step (GEMM
tiling depends on the row count), so where the no-draft comparison fails the cell is compared with
its same-shape baseline (acceptance 'reject': the same drafter, batch and width, every draft
rejected), which isolates the acceptance logic; the row's `gate` says which comparison held.

Compiles: every row counts the XLA executables its (cell, leg) built. Cells with the same static
shapes (StepConfig, batch, prompt bucket, cache slots) reuse them, so a leg after the first should
build none; a row that did shows a static shape that changes where it should not.
"""

import dataclasses
import hashlib
import itertools
import json
import math
import os

import jax.numpy as jnp
import numpy as np

import specdec
from specdec import metrics, sharding
from specdec.checkpoint.zoo import resolve_path
from specdec.data import workload as workload_lib
from specdec.decoding import budget as budget_lib
from specdec.decoding import memory
from specdec.decoding.accept import base_mode, validate_mode
from specdec.decoding.compiles import CompileCounter
from specdec.decoding.generate import (  # _tree_plan: generate's own tree checks, run ahead
  _tree_plan,
  cache_slots,
  check_cache_room,
  generate,
  lower_ahead,
  prompt_bucket,
)
from specdec.drafters import draft_lm, ngram, null, suffix
from specdec.lab import results
from specdec.lab import trees as trees_lib
from specdec.models.fuse import quantized
from specdec.ops.sampling import Sampling

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# "bf16" is the target as loaded (in config.dtype); the others quantize its linear layers.
TARGET_FORMATS = ("bf16", "nvfp4", "fp8", "exl3_3", "exl3_4")
# "model": the target's own (its dtype, or FP8 where the checkpoint declares an FP8 KV cache). An
# FP8 cache on a target without k/v scales runs with scales 1.0 (see specdec.generate).
KV_DTYPES = ("model", "float32", "bfloat16", "float8_e4m3fn")


# Methods built from the config alone, with no checkpoint.
MODEL_FREE = ("null", "ngram", "suffix")
# config.suffix where a config has none: arctic-inference's defaults as vLLM sets them, and a
# small store, since the sweep keeps no earlier requests (they would be memory across legs).
SUFFIX_DEFAULTS = dict(
  max_depth=24, max_spec_factor=1.0, max_spec_offset=0.0, min_token_prob=0.1, store_size=256
)


class SweepError(ValueError):
  """A sweep config that cannot run; raised before anything compiles."""


@dataclasses.dataclass(frozen=True)
class Cell:
  method: str
  k: int | str  # a draft length, or "auto" (chosen per step among config.budget_tiers)
  workload: str  # an entry of config.workloads
  prompt_tokens: int  # 0: prompts as they are
  temperature: float
  top_k: int
  top_p: float
  acceptance: str
  target_format: str
  kv_dtype: str
  batch: int
  sample_seed: int  # an entry of config.seeds; greedy cells carry the first
  # A static tree's label (specdec.lab.trees), k its depth; "auto" (k "auto" too): tree="auto"
  # among config.budget_tree_tiers; None: a chain.
  tree: str | None = None
  target: str = ""  # the target's checkpoint: config.target, or the method's per_method target

  @property
  def baseline(self) -> "Cell":
    return dataclasses.replace(
      self, method="null", k=0, acceptance=_auto(self.temperature), tree=None
    )

  @property
  def draft(self) -> str:
    """What the cell drafts, for messages: "k=4", "k=auto" or "tree=binary2"."""
    return f"k={self.k}" if self.tree is None else f"tree={self.tree}"


def _auto(temperature: float) -> str:
  return "greedy" if temperature == 0 else "onehot"


LEG_SEED_STRIDE = 1000  # a leg's batches take seeds seed + i, i < n_prompts
SAMPLE_SEED_STRIDE = 1_000_000


def budget_of(cfg, trees: bool = False) -> budget_lib.Budget:
  """The tiers a k="auto" cell chooses among (config.budget_tiers, else the library's), or with
  `trees` a tree="auto" cell (config.budget_tree_tiers: presets or PATHS, else the library's)."""
  if not trees:
    return budget_lib.Budget(tiers=tuple(cfg.get("budget_tiers", budget_lib.DEFAULT_TIERS)))
  specs = cfg.get("budget_tree_tiers", ())
  tiers = tuple(trees_lib.resolve(t)[1] for t in specs) or budget_lib.DEFAULT_TREE_TIERS
  return budget_lib.Budget(tiers=tiers)


def cell_budget(cfg, cell: "Cell") -> budget_lib.Budget | None:
  """The budget an auto cell chooses among; None for a fixed k or tree."""
  return budget_of(cfg, cell.tree == "auto") if cell.k == "auto" else None


def widest_k(cfg, cell: "Cell") -> int:
  """The verify depth a cell's caches must hold: its k, or the deepest tier of an auto cell."""
  budget = cell_budget(cfg, cell)
  return budget.k_max if budget else cell.k


def written_slots(cfg, cell: "Cell") -> int:
  """Slots a verify of the cell writes after the newest token: its k, a tree's n - 1, an auto
  cell's largest tier's."""
  budget = cell_budget(cfg, cell)
  if budget:
    return max(budget.sizes)
  return cell.k if cell.tree is None else trees_lib.resolve(cell.tree)[1].size - 1


def cell_trees(cfg, cell: "Cell") -> list:
  """The trees a cell verifies: its static tree, every tier of tree="auto", none for a chain."""
  if cell.tree == "auto":
    return list(budget_of(cfg, True).tiers)
  return [] if cell.tree is None else [trees_lib.resolve(cell.tree)[1]]


def tree_axis(cfg) -> list[tuple[str, int | str]]:
  """(label, depth) of each config.trees entry, in order ("auto": ("auto", "auto")); a bad spec
  is a SweepError naming it."""
  axis = []
  for spec in cfg.get("trees", ()):
    if spec == "auto":
      axis.append(("auto", "auto"))
      continue
    try:
      label, t = trees_lib.resolve(spec)
    except ValueError as e:
      raise SweepError(f"config.trees: {spec!r}: {e}") from e
    axis.append((label, t.depth))
  return axis


def _k(k) -> int | str:
  return k if isinstance(k, str) else int(k)  # a string other than "auto": validate names it


def leg_seed(base: int, sample_seed: int, leg: int) -> int:
  """The seed of a (cell, leg), stored in its row; its batch at prompt i samples with seed + i."""
  return base + SAMPLE_SEED_STRIDE * sample_seed + LEG_SEED_STRIDE * leg


STR_AXES = ("methods", "workloads", "acceptances", "target_formats", "kv_dtypes")


def normalize(cfg):
  """Lets string axes be given on the command line as `--config.methods=null,ngram`; an older
  config's single `workload` becomes the one-entry axis `workloads`."""
  cfg = cfg.copy_and_resolve_references()
  with cfg.unlocked():
    if "workload" in cfg:
      if "workloads" in cfg:
        raise SweepError(
          f"config.workload={cfg.workload!r} and config.workloads={cfg.workloads!r}: the single "
          "workload became the axis config.workloads; set that one only"
        )
      cfg.workloads = (cfg.workload,)
      del cfg["workload"]
    for name in STR_AXES:
      items = (cfg[name],) if isinstance(cfg[name], str) else cfg[name]
      cfg[name] = tuple(v.strip() for item in items for v in item.split(",") if v.strip())
    if "trees" in cfg:  # preset names as --config.trees=wide3,binary2; paths as they are
      items = (cfg.trees,) if isinstance(cfg.trees, str) else cfg.trees
      cfg.trees = tuple(spec for item in items for spec in _tree_specs(item))
    for name in ("ks", "prompt_tokens", "temperatures", "top_ks", "top_ps", "batches", "seeds"):
      if isinstance(cfg[name], int | float):
        cfg[name] = (cfg[name],)
    for setting in cfg.get("per_method", {}).values():
      for name in ("ks", "prompt_tokens"):
        if isinstance(setting.get(name), int | float):
          setting[name] = (setting[name],)
  return cfg


def _tree_specs(item) -> list:
  """A config.trees entry as specs: comma-separated preset names split, paths (a tuple, or JSON
  as a label writes them) kept whole."""
  if not isinstance(item, str):
    return [item]
  if item.strip().startswith("["):
    return [item.strip()]
  return [v.strip() for v in item.split(",") if v.strip()]


PER_METHOD = ("target", "ks", "prompt_tokens")  # what config.per_method may set for a method


def setting(cfg, method: str, name: str):
  """The method's `name` (one of PER_METHOD): its config.per_method entry, else the sweep's."""
  own = cfg.get("per_method", {}).get(method, {})
  return own[name] if name in own else cfg[name]


def method_targets(cfg) -> dict[str, str]:
  """{drafted method: the target it runs on}: its per_method target, else config.target."""
  return {m: setting(cfg, m, "target") for m in cfg.methods if m != "null"}


def targets(cfg) -> list[str]:
  """The sweep's targets: config.target, then each other one its methods' per_method names."""
  return list(dict.fromkeys([cfg.target, *method_targets(cfg).values()]))


def target_config(cfg, target: str):
  """The config of one target's share of the sweep: `target` and the methods that run on it."""
  mine = [m for m, t in method_targets(cfg).items() if t == target]
  sub = cfg.copy_and_resolve_references()
  with sub.unlocked():
    sub.target, sub.methods = target, ("null", *mine)
  return sub


def expand(cfg) -> list[Cell]:
  """Every cell of the config's axes; the no-draft arm (k = 0) is always included, first, on every
  target: on config.target at every prompt length, on a per_method target at those of the
  methods that run on it. Each drafted method runs every k of its ks, then every tree of
  config.trees (at k = its depth), at each of its prompt_tokens, on its target."""
  trees = [(d, t) for t, d in tree_axis(cfg)]
  plans = []  # (method, target, [(k, tree)], prompt lengths)
  on = method_targets(cfg)
  for target in targets(cfg):
    mine = [m for m, t in on.items() if t == target]
    lengths = [pt for m in mine for pt in setting(cfg, m, "prompt_tokens")]
    plans.append(
      ("null", target, [(0, None)], cfg.prompt_tokens if target == cfg.target else lengths)
    )
  for m, target in on.items():
    drafts = [(_k(k), None) for k in setting(cfg, m, "ks")] + trees
    plans.append((m, target, drafts, setting(cfg, m, "prompt_tokens")))
  cells = []
  for method, target, drafts, lengths in plans:
    for (k, tree), w, pt, t, tk, tp, acc, fmt, kv, b in itertools.product(
      drafts, cfg.workloads, dict.fromkeys(lengths), cfg.temperatures, cfg.top_ks, cfg.top_ps,
      cfg.acceptances, cfg.target_formats, cfg.kv_dtypes, cfg.batches,
    ):  # fmt: skip
      acc = _auto(t) if acc == "auto" or method == "null" else acc
      for s in cfg.seeds if t else cfg.seeds[:1]:
        cells.append(
          Cell(
            method, k, w, int(pt), float(t), int(tk), float(tp), acc, fmt, kv, int(b), int(s), tree,
            target,
          )
        )  # fmt: skip
  return list(dict.fromkeys(cells))


def suffix_drafter(cfg):
  """The suffix drafter of config.suffix (SUFFIX_DEFAULTS for what it leaves out)."""
  opts = {**SUFFIX_DEFAULTS, **(cfg.suffix.to_dict() if "suffix" in cfg else {})}
  try:
    return suffix(**opts)
  except (TypeError, ValueError) as e:
    raise SweepError(f"config.suffix: {e}") from e


def check_methods(cfg) -> None:
  known = (*MODEL_FREE, *cfg.checkpoints.keys())
  for m in cfg.methods:
    if m not in known:
      raise SweepError(
        f"config.methods: unknown method {m!r}; available: {', '.join(known)} "
        "(checkpointed drafters are listed in config.checkpoints)"
      )
  if "suffix" in cfg.methods:
    suffix_drafter(cfg)
  for m, own in cfg.get("per_method", {}).items():
    if m == "null":
      raise SweepError(
        "config.per_method.null: the no-draft arm runs on every target, at every prompt length "
        "its methods run; it has no settings of its own"
      )
    if m not in known:
      raise SweepError(
        f"config.per_method.{m}: unknown method {m!r}; available: {', '.join(known)}"
      )
    extra = sorted(set(own) - set(PER_METHOD))
    if extra:
      raise SweepError(
        f"config.per_method.{m}: unknown setting(s) {', '.join(extra)}; a method may set "
        f"{', '.join(PER_METHOD)}"
      )


def validate(
  cfg, cells: list[Cell], max_positions: int | None = None, prompt_len=None, check_cell=None
) -> None:
  """Every cell's checks before anything compiles. Without max_positions and prompt_len(cell) (the
  cell's longest prompt, Runner.longest_prompt) only those that need no model; check_cell(cell)
  adds the ones that need the loaded models (Runner.check_memory)."""
  for name in ("ks", "workloads", "prompt_tokens", "temperatures", "batches", "methods", "seeds"):
    if not len(cfg[name]):
      raise SweepError(f"config.{name} is empty")
  for m, own in cfg.get("per_method", {}).items():
    for name in ("ks", "prompt_tokens"):
      if name in own and not len(own[name]):
        raise SweepError(f"config.per_method.{m}.{name} is empty")
  if len(set(cfg.seeds)) < len(cfg.seeds) or min(cfg.seeds) < 0:
    raise SweepError(f"config.seeds={tuple(cfg.seeds)}: need distinct seeds >= 0")
  tp = cfg.get("tensor_parallel", 1)
  if not isinstance(tp, int) or tp < 1:
    raise SweepError(f"config.tensor_parallel={tp!r}: must be an int >= 1")
  try:
    memory.check_fraction(cfg.memory_fraction)
  except ValueError as e:
    raise SweepError(f"config.memory_fraction: {e}") from e
  if cfg.legs < 2:
    raise SweepError(f"config.legs={cfg.legs}: arms need >= 2 interleaved legs")
  if min(cfg.batches) < 1:
    raise SweepError(f"config.batches={tuple(cfg.batches)}: a batch holds >= 1 request")
  if cfg.n_prompts < 2 * max(cfg.batches):
    raise SweepError(
      f"config.n_prompts={cfg.n_prompts}: the first batch of each (cell, leg) is warm-up, so with "
      f"config.batches={tuple(cfg.batches)} at least {2 * max(cfg.batches)} prompts are needed "
      "for one timed batch"
    )
  if any(cfg.n_prompts % b for b in cfg.batches):
    raise SweepError(
      f"config.n_prompts={cfg.n_prompts} is not a multiple of every batch in "
      f"config.batches={tuple(cfg.batches)}: a short last batch would compile other shapes "
      "inside the timed requests"
    )
  check_methods(cfg)
  if "auto" in tuple(cfg.ks):
    try:
      budget_of(cfg).validate()
    except ValueError as e:
      raise SweepError(f"config.budget_tiers: {e}") from e
  if "auto" in tuple(cfg.get("trees", ())):
    try:
      budget_of(cfg, trees=True).validate()
    except ValueError as e:
      raise SweepError(f"config.budget_tree_tiers: {e}") from e
  for w in cfg.workloads:
    try:
      workload_lib.load_workload(w)
    except workload_lib.WorkloadError as e:
      raise SweepError(f"config.workloads: {w!r}: {e}") from e
  for c in cells:
    if c.target_format not in TARGET_FORMATS:
      raise SweepError(f"config.target_formats: {c.target_format!r} is not available yet")
    if c.kv_dtype not in KV_DTYPES:
      raise SweepError(f"config.kv_dtypes: unknown {c.kv_dtype!r}; choose from {KV_DTYPES}")
    if c.method != "null" and c.k != "auto" and (not isinstance(c.k, int) or c.k < 1):
      raise SweepError(f"config.ks: k={c.k!r} must be an integer >= 1 or 'auto'")
    if c.prompt_tokens < 0:
      raise SweepError(f"config.prompt_tokens: {c.prompt_tokens} is not a length (>= 0)")
    if c.prompt_tokens == 0 and workload_lib.is_document_workload(c.workload):
      raise SweepError(
        f"config.prompt_tokens: workload {c.workload!r} cuts documents to each length, so 0 "
        "(prompts as they are) does not apply to it; give lengths > 0"
      )
    # The same checks generate() makes, run for every cell before anything compiles.
    sampling = Sampling(c.temperature, c.top_k, c.top_p)
    try:
      sampling.validate()
      validate_mode(c.acceptance, sampling)
      if max_positions is not None:
        check_cache_room(prompt_len(c), cfg.max_new_tokens, written_slots(cfg, c), max_positions)
      if check_cell is not None:
        check_cell(c)
    except ValueError as e:
      raise SweepError(
        f"cell {c.method} {c.draft} prompt_tokens={c.prompt_tokens}: workload {c.workload!r}: {e}"
      ) from e


def chat_template_of(path: str) -> str:
  """The target's chat template (HF keeps it in tokenizer_config.json)."""
  file = os.path.join(path, "tokenizer_config.json")
  template = None
  if os.path.exists(file):
    with open(file) as f:
      template = json.load(f).get("chat_template")
  if not isinstance(template, str):
    raise SweepError(f"config.chat_template=True, but {file} holds no chat_template string")
  return template


def load_drafter(method: str, spec: str, target, dtype):
  """The drafter of a checkpointed method, its checkpoint checked against the target: a draft LM
  for a method named draft_lm*, else whichever published drafter layout the directory holds (told
  apart by its keys: specdec.drafters.checkpoints.detect), any method name."""
  from specdec.checkpoint.safetensors_io import CheckpointError
  from specdec.drafters import checkpoints

  path = resolve_path(spec)
  if not os.path.isdir(path):
    raise SweepError(f"config.checkpoints.{method}: {spec!r} is not a checkpoint directory")
  try:
    if method.startswith("draft_lm"):
      return draft_lm(specdec.load(path, dtype=dtype))
    return checkpoints.load_drafter(path, target)
  except (CheckpointError, ValueError) as e:
    raise SweepError(f"config.checkpoints.{method}: {e}") from e


def output_sha(tokens: list[list[int]]) -> str:
  return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]


class Runner:
  """Holds the loaded models and prompts of one sweep; runs (cell, leg) units."""

  def __init__(self, cfg, target, drafters: dict, mesh=None):
    self.cfg, self.target, self.mesh = cfg, target, mesh
    self._targets = {}  # target format -> the model that decodes (quantized, fused as asked)
    self.drafters = {"null": null(), "ngram": ngram(cfg.ngram.min_n, cfg.ngram.max_n), **drafters}
    if "suffix" in cfg.methods:
      self.drafters["suffix"] = suffix_drafter(cfg)
    self.prompts = {
      w: workload_lib.select(workload_lib.load_workload(w), cfg.n_prompts) for w in cfg.workloads
    }
    self._template = chat_template_of(resolve_path(cfg.target)) if cfg.chat_template else None
    self._answers: dict[tuple[str, ...], str] = {}
    self._ids: dict = {}
    self._greedy_ref: dict = {}

  def prompt_ids(self, cell: Cell, leg: int) -> list[list[int]]:
    """The token ids of the cell's prompts in leg `leg` (its workload at its prompt length)."""
    key = (cell.workload, cell.prompt_tokens, leg)
    if key not in self._ids:
      V = self.target.config.vocab_size
      ids = []
      for i, p in enumerate(self.prompts[cell.workload]):
        try:
          ids.append(
            workload_lib.prompt_ids(
              self._text(p), self.target.encode, target_len=cell.prompt_tokens or None,
              filler=workload_lib.source_filler(i), document=p.document, repetition=leg,
              vocab_size=V, avoid=self.target.config.eos_token_ids,
            )
          )  # fmt: skip
        except ValueError as e:
          raise SweepError(
            f"config.workloads: {cell.workload!r} prompt {p.id} at prompt_tokens="
            f"{cell.prompt_tokens}: {e}"
          ) from e
      self._ids[key] = ids
    return self._ids[key]

  def longest_prompt(self, cell: Cell) -> int:
    return max(len(p) for p in self.prompt_ids(cell, 0))

  def bucket(self, cell: Cell) -> int:
    return prompt_bucket(self.longest_prompt(cell))

  def _text(self, p: workload_lib.Prompt) -> str:
    """What the model reads for p: a document as it is; a prompt through the chat template where
    the config asks, after its earlier turns (a multi-turn record), each answered by the target."""
    return p.text if p.document else self._render((*p.history, p.text))

  def _render(self, turns: tuple[str, ...]) -> str:
    history = [(t, self._answer(turns[: j + 1])) for j, t in enumerate(turns[:-1])]
    return workload_lib.render_prompt(turns[-1], self._template, history=history)

  def _answer(self, turns: tuple[str, ...]) -> str:
    """The target's answer to the last of `turns`: its greedy continuation, as loaded, with no
    drafter, max_new_tokens long or to its EOS. That is the no-draft arm's output for that turn
    (at T = 0, prompt_tokens 0, leg 0), and one answer serves every cell and leg, so every arm of
    a later turn reads the same prompt and the arms stay paired."""
    if turns not in self._answers:
      ids = self.target.encode(self._render(turns))
      out = generate(
        self.target, [ids], max_new_tokens=self.cfg.max_new_tokens,
        memory_fraction=self.cfg.memory_fraction,
      ).tokens[0]  # fmt: skip
      eos = set(self.target.config.eos_token_ids)
      self._answers[turns] = self.target.decode([t for t in out if t not in eos])
    return self._answers[turns]

  def check_memory(self, cell: Cell) -> None:
    """generate()'s memory plan for a full batch of the cell on the target as loaded (fused at
    load, so no second copy; a quantized target, built later, is smaller but stays resident
    beside it: generate() checks it then), after the drafter's own checks of the cell (at the
    widest k it runs) and, for a tree cell, generate()'s tree checks (the drafter drafts trees,
    the target and acceptance mode allow them)."""
    bucket, k = self.bucket(cell), widest_k(self.cfg, cell)
    slots = cache_slots(bucket, self.cfg.max_new_tokens, written_slots(self.cfg, cell))
    drafter = self.drafters[cell.method]
    mode = base_mode(cell.acceptance, Sampling(cell.temperature, cell.top_k, cell.top_p))
    for t in cell_trees(self.cfg, cell):
      _tree_plan(self.target, drafter, None, t, mode)
    drafter.validate(self.target.config, k, slots)
    memory.check_fits(
      self.target, drafter, k, cell.batch, bucket, slots, kv_dtype(cell),
      self.cfg.memory_fraction,
    )  # fmt: skip

  def _call(self, cell: Cell, ids, seed, drafter_name=None, temperature=None, acceptance=None):
    """The (model, prompts, keyword arguments) of the cell's generate call."""
    t = cell.temperature if temperature is None else temperature
    name = drafter_name or cell.method
    kw = dict(
      max_new_tokens=self.cfg.max_new_tokens, temperature=t, top_k=cell.top_k if t else 0,
      top_p=cell.top_p if t else 1.0, seed=seed, drafter=self.drafters[name],
      k=cell.k if name != "null" else 0,
      acceptance=acceptance or (cell.acceptance if t else "greedy"),
      min_bucket=self.bucket(cell), kv_dtype=kv_dtype(cell),
      memory_fraction=self.cfg.memory_fraction,
    )  # fmt: skip
    if self.mesh is not None:
      kw["mesh"] = self.mesh
    if kw["k"] == "auto":
      kw["budget"] = cell_budget(self.cfg, cell)
    if cell.tree == "auto" and name != "null":
      kw["k"], kw["tree"] = None, "auto"  # its depths are the tiers'
    elif cell.tree is not None and name != "null":
      kw["tree"] = cell_trees(self.cfg, cell)[0]
    return self.target_for(cell.target_format), ids, kw

  def target_for(self, fmt: str):
    """The target that decodes cells of target format `fmt`, quantized once; under a mesh placed
    on it, where a shape the mesh cannot split is a SweepError before anything compiles."""
    if fmt not in self._targets:
      target = self.target if fmt == "bf16" else quantized(self.target, fmt)
      if self.mesh is not None:
        try:
          target = sharding.on_mesh(target, self.mesh)
        except sharding.ShardingError as e:
          tp = self.mesh.shape["tensor"]
          raise SweepError(f"config.tensor_parallel={tp} with target format {fmt!r}: {e}") from e
      self._targets[fmt] = target
    return self._targets[fmt]

  def _generate(self, cell: Cell, ids, seed, drafter_name=None, temperature=None, acceptance=None):
    model, ids, kwargs = self._call(cell, ids, seed, drafter_name, temperature, acceptance)
    return generate(model, ids, **kwargs)

  def lower_ahead(self, cell: Cell) -> list:
    """The cell's executables (their shapes do not change with the leg), lowered, not compiled:
    its batches, and for a sampled cell the greedy gate check; the same-shape baseline runs the
    greedy executable (`reject` is a run-time flag). Lowers in this thread (see
    `generate.lower_ahead`): call it for every cell in one order, then compile the list."""
    ids = self.prompt_ids(cell, 0)
    calls = [(ids[: cell.batch], {})]
    if cell.temperature:
      gate = ids[:GATE_PROMPTS]
      calls += [(gate, dict(drafter_name="null", temperature=0.0))]
      calls += [(gate, dict(temperature=0.0, acceptance="greedy"))]
    lowered = []
    for prompts, kw in calls:
      model, prompts, kwargs = self._call(cell, prompts, 0, **kw)
      lowered += lower_ahead(model, prompts, **kwargs)
    return lowered

  def run(self, cell: Cell, leg: int, baseline_sha: str | None) -> dict:
    with CompileCounter() as built:
      row = self._measure(cell, leg, baseline_sha)
    return {**row, "compiles": built.count, "compile_s": built.seconds}

  def _measure(self, cell: Cell, leg: int, baseline_sha: str | None) -> dict:
    ids = self.prompt_ids(cell, leg)
    seed = leg_seed(self.cfg.seed, cell.sample_seed, leg)
    timing, entries, counts, outputs, calls, auto = [], [], [], [], [], []
    for b, g in enumerate(self._batches(cell, ids, seed)):
      timed = b > 0  # the first batch compiles: warm-up
      reqs, rs = request_entries(g.stats, timed)
      timing += reqs
      entries += rs
      counts.append({name: np.asarray(g.stats[name]) for name in metrics.COUNTS})
      calls.append({"timed": timed, **{name: g.stats[name] for name in CALL_FIELDS}})
      if cell.k == "auto":
        auto.append({name: np.asarray(g.stats[name]) for name in budget_lib.COUNT_FIELDS})
        calls[-1]["k_trace"] = g.stats["k_trace"]
      outputs.extend(g.tokens)
    sha = output_sha(outputs)
    gate, passed = self._gate(cell, leg, sha, baseline_sha)
    if not passed and cell.temperature == 0:
      same = [t for g in self._batches(cell, ids, seed, acceptance="reject") for t in g.tokens]
      gate, passed = "greedy outputs == same-shape baseline (not == no-draft arm)", same == outputs
    pooled = {name: np.sum([c[name] for c in counts], axis=0) for name in metrics.COUNTS}
    timed_calls = [c for c in calls if c["timed"]]
    row = {
      **dataclasses.asdict(cell),
      "ctx_bucket": metrics.bucket_labels()[int(metrics.ctx_bucket(len(ids[0])))],
      "seed": seed,
      "leg": leg,
      "drafter": self.cfg.checkpoints.get(cell.method, cell.method),
      "max_new_tokens": self.cfg.max_new_tokens,
      "n_prompts": len(ids),
      **results.environment_fields(),
      **metrics.acceptance_summary(*(pooled[name] for name in metrics.COUNTS)),
      **{name: v.tolist() for name, v in pooled.items()},
      "ctx_edges": [None if math.isinf(e) else e for e in metrics.DEFAULT_CTX_EDGES],
      "tree_paths": None if cell.tree == "auto" else g.stats["tree"],
      "verify_width": g.stats["verify_width"],
      "loop_steps": sum(c["loop_steps"] for c in timed_calls),
      "host_syncs": sum(c["host_syncs"] for c in timed_calls),
      **metrics.timing_summary(timing, discard_first=cell.batch),
      "requests": entries,
      "gate_passed": passed,
      "gate": gate,
      "extra": {
        "output_sha": sha,
        "prompt_lengths": [len(p) for p in ids],
        "prompts": [p.id for p in self.prompts[cell.workload]],
        "chat_template": bool(self.cfg.chat_template),
        "fuse_projections": bool(self.cfg.fuse_projections),
        "chunk_steps": g.stats["chunk_steps"],  # generate's CHUNK_STEPS, the same for every call
        "calls": calls,
      },
    }
    if auto:
      row |= auto_fields(auto, row["steps"], entries, g.stats["tiers"])
      row |= {"tier_trees": g.stats["tier_trees"]} if cell.tree == "auto" else {}
    return row

  def _gate(self, cell: Cell, leg: int, sha: str, baseline_sha: str | None):
    if cell.method == "null":
      return "baseline", True
    if cell.temperature == 0:
      return "greedy outputs == no-draft arm, same leg", sha == baseline_sha
    # Sampled cell: greedy check of the same drafter and k on the first prompts.
    ids = self.prompt_ids(cell, leg)[:GATE_PROMPTS]
    key = (cell.workload, cell.prompt_tokens, leg)
    if key not in self._greedy_ref:
      self._greedy_ref[key] = self._generate(cell, ids, 0, "null", 0.0).tokens
    out = self._generate(cell, ids, 0, temperature=0.0, acceptance="greedy").tokens
    if out == self._greedy_ref[key]:
      return f"greedy check ({len(ids)} prompts) == no-draft arm", True
    same = self._generate(cell, ids, 0, temperature=0.0, acceptance="reject").tokens
    gate = f"greedy check ({len(ids)} prompts) == same-shape baseline (not == no-draft arm)"
    return gate, out == same

  def _batches(self, cell: Cell, ids, seed: int, **kw):
    """The cell's generations over ids, cell.batch prompts at a time."""
    for i in range(0, len(ids), cell.batch):
      yield self._generate(cell, ids[i : i + cell.batch], seed + i, **kw)


class Runners(dict):
  """The Runner of each target of a sweep (by its checkpoint spec); each cell runs on its own
  target's, with the same interface as one Runner."""

  def bucket(self, cell: Cell) -> int:
    return self[cell.target].bucket(cell)

  def lower_ahead(self, cell: Cell) -> list:
    return self[cell.target].lower_ahead(cell)

  def run(self, cell: Cell, leg: int, baseline_sha: str | None) -> dict:
    return self[cell.target].run(cell, leg, baseline_sha)


GATE_PROMPTS = 2  # a sampled cell's greedy check runs its first prompts
# What a row keeps of each generate call (extra["calls"]).
CALL_FIELDS = ("loop_steps", "host_syncs", "compiles")
# The per-request counters of generate's stats["rows"] a row's request entries keep.
REQUEST_COUNTS = ("steps", "emitted", "accepted", "proposed")


def request_entries(stats: dict, timed: bool) -> tuple[list[metrics.Request], list[dict]]:
  """One generate call's requests: host timestamps for metrics.timing_summary, and the row's
  entries (timing, the loop's counters, per-request tau and acceptance, whether timed)."""
  start = stats["start_s"]
  reqs = [
    metrics.Request(start, start + stats["prefill_s"], start + fin, n_out)
    for n_out, fin in zip(stats["tokens_out"], stats["finish_s"], strict=True)
  ]
  counts = {name: stats["rows"][name] for name in REQUEST_COUNTS}
  per = metrics.per_request(**counts)
  tpot = metrics.tpot_ms(
    [r.latency_ms for r in reqs], [r.ttft_ms for r in reqs], stats["tokens_out"]
  )
  entries = [
    {
      "n_out": r.n_out,
      "ttft_ms": r.ttft_ms,
      "latency_ms": r.latency_ms,
      "tpot_ms": float(tpot[i]),
      **{name: int(counts[name][i]) for name in REQUEST_COUNTS},
      "tau": per["tau"][i],
      "acceptance_rate": per["acceptance_rate"][i],
      "timed": timed,
    }
    for i, r in enumerate(reqs)
  ]
  return reqs, entries


def auto_fields(calls: list[dict], steps: int, entries: list[dict], tiers: list[int]) -> dict:
  """A k="auto" row's tier and position counts pooled over its generate calls, and the
  acceptance fields computed from them (`budget.summary`) in place of the histogram's."""
  pooled = {name: np.sum([c[name] for c in calls], axis=0).tolist() for name in calls[0]}
  total = lambda name: sum(e[name] for e in entries)  # noqa: E731
  fields = budget_lib.summary(pooled, steps, total("proposed"), total("accepted"))
  fields.pop("mean_k")  # proposed / steps: a table derives it
  return {"tiers": tiers, **pooled, **fields}


def kv_dtype(cell: Cell):
  """The cell's KV cache dtype for generate(); None keeps the target's own."""
  return None if cell.kv_dtype == "model" else jnp.dtype(cell.kv_dtype)


def baseline_key(cell: Cell, leg: int) -> tuple:
  return (*dataclasses.astuple(cell.baseline), leg)


def cell_of(row: dict) -> tuple:
  """The (cell, leg) a row measured; a row from before the tree axis is a chain's."""
  return (*(row.get(f.name) for f in dataclasses.fields(Cell)), row["leg"])
