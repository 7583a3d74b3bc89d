"""A sweep's results store: DIR/config.json and DIR/results.jsonl, one JSON row per (cell, leg).

Rows are appended one whole line per write and fsynced, so a killed run leaves at worst a truncated
last line; readers ignore it and the next writer cuts it off before appending. A re-run reads the
finished (cell, leg) keys and skips them; config.json pins what the sweep measures, so a resume with
different sweep settings is refused instead of mixing two sweeps in one file. One writer per file.

Rows are strict JSON: NaN and +-inf are written as null (so `jq` and other readers accept the file);
readers turn null back into NaN where a number is expected.
"""

import dataclasses
import datetime
import fcntl
import json
import logging
import math
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

RESULTS_NAME = "results.jsonl"
CONFIG_NAME = "config.json"


class ResultsError(ValueError):
  """The results directory or one of its files cannot be used as asked."""


@dataclasses.dataclass(frozen=True)
class Field:
  kind: str  # "str" | "int" | "float" | "bool" | "list" | "dict" | "k" (an int or "auto")
  required: bool
  doc: str


_F = Field
ROW_FIELDS: dict[str, Field] = {
  # What was measured: the cell. Every condition of docs/design.md, "Measurement conventions",
  # is required.
  "method": _F(
    "str", True, "drafter: null (AR baseline, k=0), same_shape, ngram, draft_lm, mtp, ..."
  ),
  "k": _F(
    "k",
    True,
    "draft tokens per step (DFlash block size minus 1); 0 for the baseline; 'auto': "
    "chosen on the device before each step among `tiers`",
  ),
  "tree": _F(
    "str",
    False,
    "a static draft tree's label (specdec.lab.trees: a preset's name, or its paths as JSON), k "
    "its depth; 'auto' (k 'auto' too): chosen on the device among `tier_trees`; null: a chain",
  ),
  "tree_paths": _F(
    "list", False, "the tree's paths of child ranks, in node order; null: a chain or tree 'auto'"
  ),
  "verify_width": _F(
    "int", False, "tokens each verify feeds the target: k+1 for a chain, a tree's nodes (root too)"
  ),
  "workload": _F("str", True, "'humaneval' or the prompt file's name"),
  "prompt_tokens": _F("int", True, "prompt length in tokens the cell targets (after extension)"),
  "ctx_bucket": _F("str", True, "metrics.bucket_labels label of the bucket holding prompt_tokens"),
  "temperature": _F("float", True, "sampling temperature; 0 = greedy"),
  "top_k": _F("int", True, "top-k filter, 0 = off"),
  "top_p": _F("float", True, "top-p filter, 1.0 = off"),
  "acceptance": _F("str", True, "acceptance mode: greedy | onehot | fullq"),
  "target_format": _F("str", True, "target weight format: bf16 | fp8 | nvfp4 | exl3"),
  "kv_dtype": _F("str", True, "KV cache dtype"),
  "batch": _F("int", True, "sequences decoded together (concurrency)"),
  "sample_seed": _F("int", False, "entry of config.seeds (sampled cells; greedy: the first)"),
  "seed": _F("int", True, "PRNG seed of the leg (its batch at prompt i uses seed + i)"),
  "leg": _F("int", True, "leg index; arms run interleaved A, B, A, B and leg l of every arm pairs"),
  "target": _F("str", False, "target checkpoint name or path"),
  "drafter": _F("str", False, "drafter checkpoint name or path"),
  "max_new_tokens": _F("int", False, "completion token budget per request"),
  "n_prompts": _F("int", False, "prompts in the leg"),
  # Where and when.
  "device": _F("str", True, "jax.local_devices()[0].device_kind"),
  "jax_version": _F("str", True, "jax.__version__"),
  "git_commit": _F("str", True, "`git rev-parse HEAD` of the code, or 'unknown'"),
  "git_dirty": _F("bool", False, "the work tree had uncommitted changes"),
  "attention": _F("str", False, "auto: the Mosaic GPU attention kernel where it applies | xla"),
  "xla_flags": _F("str", False, "XLA_FLAGS of the process, specdec's defaults included"),
  "timestamp": _F("str", True, "ISO 8601 UTC time the row was written"),
  # Acceptance, from the loop's counts (specdec.metrics.acceptance_summary).
  "steps": _F("int", False, "verify steps (target forwards after the prefill) counted"),
  "emitted": _F("int", False, "tokens those steps emitted (the prefill's first token not)"),
  "censored": _F("int", False, "steps whose emission the budget or an EOS cut short"),
  "proposed": _F("int", False, "draft tokens proposed"),
  "accepted": _F("int", False, "draft tokens accepted"),
  "accept_hist": _F("list", False, "[n_ctx_buckets][k+1] steps by accepted count, per ctx bucket"),
  "censored_hist": _F("list", False, "[n_ctx_buckets][k+1] the censored steps among accept_hist"),
  "emitted_by_bucket": _F("list", False, "[n_ctx_buckets] tokens emitted by each bucket's steps"),
  "ctx_edges": _F("list", False, "bucket edges of accept_hist; null stands for +inf"),
  "tau": _F("float", False, "emitted / steps: tokens per target forward incl. bonus, in [1, k+1]"),
  "tau_accepted": _F("float", False, "1 + mean accepted drafts per step (the verifier's count)"),
  "acceptance_rate": _F("float", False, "accepted / proposed"),
  "per_position_uncond": _F("list", False, "[k] P(first i+1 drafts all accepted)"),
  "per_position_cond": _F(
    "list", False, "[k] P(draft i accepted | drafts < i accepted); null unseen"
  ),
  "tau_by_bucket": _F("list", False, "[n_ctx_buckets] tau per context bucket; null if empty"),
  "loop_steps": _F("int", False, "device loop iterations of the timed requests' generate calls"),
  "host_syncs": _F("int", False, "host round trips of those calls (prefill + one per chunk)"),
  "alpha": _F("float", False, "per-token acceptance, truncated-geometric MLE (metrics.alpha_mle)"),
  "predicted_tau": _F("float", False, "Leviathan (1 - alpha^(k+1)) / (1 - alpha)"),
  # k = 'auto' only (specdec.decoding.budget): the tiers, how often each ran, exact position counts.
  "tiers": _F(
    "list", False, "k='auto': the draft lengths it chose among; tree 'auto': each tier's nodes"
  ),
  "tier_trees": _F("list", False, "tree 'auto': each tier's paths of child ranks"),
  "tier_hist": _F("list", False, "k='auto': [n_tiers] row-steps run at each tier"),
  "position_offered": _F("list", False, "k='auto': [k_max] steps whose tier drafted position i"),
  "position_reached": _F("list", False, "k='auto': [k_max] steps that judged draft i"),
  "position_accepted": _F("list", False, "k='auto': [k_max] steps that accepted draft i"),
  # Timing (specdec.metrics.timing_summary); the first batch of the leg is discarded.
  "decode_tok_s": _F("float", False, "decode-only rate, 1000 / mean tpot_ms"),
  "whole_tok_s": _F("float", False, "completion tokens / wall clock of the leg"),
  "tpot_ms_mean": _F("float", False, "mean (latency - ttft) / (n_out - 1)"),
  "ttft_ms_median": _F("float", False, "median time to first token"),
  "ttft_ms_p90": _F("float", False, "p90 time to first token"),
  "ttft_ms_p99": _F("float", False, "p99 time to first token"),
  "completion_tokens": _F("int", False, "completion tokens of the timed requests"),
  "wall_s": _F("float", False, "wall clock of the timed requests"),
  "n_requests_timed": _F("int", False, "requests in the timing figures"),
  "requests": _F(
    "list",
    False,
    "per request, in prompt order: n_out, ttft_ms, latency_ms, tpot_ms, steps, emitted, accepted, "
    "proposed, tau, acceptance_rate, timed (false: the warm-up batch)",
  ),
  "roofline_pct": _F("float", False, "% of HBM roofline: bytes read per step / measured copy bw"),
  "compiles": _F(
    "int", False, "XLA executables the (cell, leg) built (warm-up, gate and cache loads included)"
  ),
  "compile_s": _F("float", False, "seconds spent building them"),
  "gate_passed": _F(
    "bool", True, "greedy outputs matched the baseline in this run; speed admissible"
  ),
  "gate": _F("str", False, "what the gate compared"),
  "extra": _F("dict", False, "free-form additions not (yet) in the schema"),
}

# The fields that identify a cell; a finished (cell, leg) is skipped on resume.
CELL_FIELDS = (
  "method",
  "k",
  "tree",
  "workload",
  "prompt_tokens",
  "temperature",
  "top_k",
  "top_p",
  "acceptance",
  "target_format",
  "kv_dtype",
  "batch",
  "sample_seed",
  "seed",
  "target",
  "drafter",
  "max_new_tokens",
)


def cell_key(row: Mapping) -> tuple:
  return tuple(row.get(f) for f in CELL_FIELDS)


def row_key(row: Mapping) -> tuple:
  """(cell, leg): the unit a re-run skips."""
  return (*cell_key(row), row.get("leg"))


# --- rows ---------------------------------------------------------------------------------------


def to_jsonable(x):
  """numpy values to Python, tuples to lists, and non-finite floats to None (strict JSON)."""
  if isinstance(x, Mapping):
    return {str(k): to_jsonable(v) for k, v in x.items()}
  if isinstance(x, np.ndarray):
    return to_jsonable(x.tolist())
  if isinstance(x, (list, tuple)):
    return [to_jsonable(v) for v in x]
  if isinstance(x, np.generic):
    return to_jsonable(x.item())
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


def _kind_ok(kind: str, v) -> bool:
  if kind == "k":  # a draft length, or "auto"
    return v == "auto" or _kind_ok("int", v)
  if kind == "int":
    return isinstance(v, int) and not isinstance(v, bool)
  if kind == "float":
    return isinstance(v, (int, float)) and not isinstance(v, bool)
  return isinstance(v, {"str": str, "bool": bool, "list": list, "dict": dict}[kind])


def validate_row(row: Mapping) -> None:
  """Raise ResultsError naming every missing, unknown or mistyped field (after to_jsonable).

  Unknown fields are refused so a typo cannot silently create a new column; put genuinely new data
  under `extra` or add it to ROW_FIELDS. None (also a NaN after to_jsonable) is allowed in optional
  fields only.
  """
  problems = [f"missing {name}" for name, f in ROW_FIELDS.items() if f.required and name not in row]
  problems += [f"unknown field {name!r}" for name in row if name not in ROW_FIELDS]
  for name, v in row.items():
    f = ROW_FIELDS.get(name)
    if f is None or (v is None and not f.required):
      continue
    if not _kind_ok(f.kind, v):
      kind = "int or 'auto'" if f.kind == "k" else f.kind
      problems.append(f"{name} should be {kind}, got {type(v).__name__} {v!r:.40}")
  if problems:
    raise ResultsError("invalid result row: " + "; ".join(problems))


def append_row(path: str | Path, row: Mapping, validate: bool = True) -> dict:
  """Append one row as one line: a single O_APPEND write of the whole line, then fsync, under an
  exclusive lock on the file (processes of one sweep append to it together).

  A truncated last line left by a killed writer is cut off first, so the new row starts on a line of
  its own. Returns the row as written.
  """
  row = to_jsonable(row)
  if validate:
    validate_row(row)
  data = (json.dumps(row, allow_nan=False, separators=(",", ":")) + "\n").encode("utf-8")
  fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes
    _cut_partial_tail(fd, path)
    written = os.write(fd, data)
    while written < len(data):  # regular files write all at once; a short write must still finish
      written += os.write(fd, data[written:])
    os.fsync(fd)
  finally:
    os.close(fd)
  return row


def _cut_partial_tail(fd: int, path) -> None:
  size = os.fstat(fd).st_size
  if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
    return
  keep = os.pread(fd, size, 0).rfind(b"\n") + 1
  log.warning("%s: dropping a truncated last line (%d bytes) from a killed run", path, size - keep)
  os.ftruncate(fd, keep)


def load_rows(path: str | Path) -> list[dict]:
  """All complete rows, in file order; [] if the file does not exist.

  A line is complete when it ends in a newline; an unterminated last line is a write cut short by a
  kill and is ignored. Any complete line that is not a JSON object is corruption and raises an error
  naming the file and line number.
  """
  path = Path(path)
  try:
    data = path.read_bytes()
  except FileNotFoundError:
    return []
  lines = data.split(b"\n")
  if lines[-1]:
    log.warning("%s: ignoring a truncated last line (%d bytes)", path, len(lines[-1]))
  rows = []
  for lineno, line in enumerate(lines[:-1], start=1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ResultsError(f"{path}:{lineno}: corrupt result row ({e}): {line[:80]!r}") from e
    if not isinstance(row, dict):
      raise ResultsError(f"{path}:{lineno}: result row is not a JSON object: {line[:80]!r}")
    rows.append(row)
  return rows


def finished_cells(path: str | Path, cell_key_fn: Callable[[Mapping], tuple] = row_key) -> set:
  """Keys of the rows already in the file, to skip on a re-run (default key: cell and leg)."""
  return {cell_key_fn(row) for row in load_rows(path)}


# --- directory and config -----------------------------------------------------------------------

# Config keys (last dotted component) that may change between a run and its resume.
VOLATILE_CONFIG_KEYS = frozenset({"out", "resume", "timestamp", "git_commit", "git_dirty", "notes"})


def prepare_out_dir(out_dir: str | Path) -> Path:
  """Create the output directory and prove it writable, before any work is done."""
  out = Path(out_dir)
  try:
    out.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=out, prefix=".write-probe-")
    os.close(fd)
    os.unlink(probe)
    results = out / RESULTS_NAME
    if results.exists() and not os.access(results, os.W_OK):
      raise PermissionError(f"{results} is read-only")
  except OSError as e:
    raise ResultsError(f"--out={out_dir} is not a writable directory: {e}") from e
  return out


def _atomic_write_text(path: Path, text: str) -> None:
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise
  dfd = os.open(path.parent, os.O_RDONLY)
  try:
    os.fsync(dfd)  # makes the rename itself durable
  finally:
    os.close(dfd)


def _flatten(d: Mapping, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, Mapping):
      out.update(_flatten(v, key + "."))
    else:
      out[key] = v
  return out


def config_diff(
  old: Mapping, new: Mapping, defining_fields: Iterable[str] | None = None
) -> dict[str, tuple]:
  """{dotted field: (old, new)} for the sweep-defining fields that differ.

  With `defining_fields` None every field counts except the VOLATILE_CONFIG_KEYS.
  """
  a, b = _flatten(to_jsonable(old)), _flatten(to_jsonable(new))
  if defining_fields is None:
    keys = [k for k in sorted(a.keys() | b.keys()) if k.split(".")[-1] not in VOLATILE_CONFIG_KEYS]
  else:
    keys = list(defining_fields)
  missing = object()
  diff = {}
  for k in keys:
    va, vb = a.get(k, missing), b.get(k, missing)
    if va != vb:
      diff[k] = (None if va is missing else va, None if vb is missing else vb)
  return diff


def write_config(
  out_dir: str | Path, config: Mapping, defining_fields: Iterable[str] | None = None
) -> bool:
  """Write DIR/config.json atomically, or check a resume against it; returns True on a resume.

  A resume (config.json already there) must agree on every sweep-defining field, else ResultsError
  names each differing field with both values. The stored config is left as the first run wrote it.
  """
  out = prepare_out_dir(out_dir)
  path = out / CONFIG_NAME
  config = to_jsonable(config)
  if path.exists():
    try:
      old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
      raise ResultsError(f"{path}: cannot read the existing config: {e}") from e
    diff = config_diff(old, config, defining_fields)
    if diff:
      lines = "\n".join(
        f"  {k}: stored {a!r}, now {b!r}" for k, a, b in ((k, *v) for k, v in diff.items())
      )
      raise ResultsError(
        f"{out} holds a different sweep; refusing to resume into it. Differing fields:\n{lines}\n"
        "Use a new --out, or the stored settings."
      )
    return True
  _atomic_write_text(path, json.dumps(config, indent=2, sort_keys=True, allow_nan=False) + "\n")
  return False


# --- environment --------------------------------------------------------------------------------


def _git(*args: str) -> str | None:
  try:
    r = subprocess.run(
      ["git", *args],
      cwd=Path(__file__).resolve().parent,
      capture_output=True,
      text=True,
      timeout=10,
    )
  except (OSError, subprocess.SubprocessError):
    return None
  return r.stdout.strip() if r.returncode == 0 else None


def utc_timestamp() -> str:
  return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def environment_fields() -> dict:
  """device, jax_version, git_commit (or 'unknown'), git_dirty, timestamp, the attention path
  (`specdec.ops.attention.attention_path`) and XLA_FLAGS for a row."""
  import jax  # imported here so the store (and table rendering) does not start a backend

  from specdec.ops.attention import attention_path

  status = _git("status", "--porcelain", "--untracked-files=no")
  return {
    "device": jax.local_devices()[0].device_kind,
    "jax_version": jax.__version__,
    "git_commit": _git("rev-parse", "HEAD") or "unknown",
    "git_dirty": bool(status) if status is not None else None,
    "timestamp": utc_timestamp(),
    "attention": attention_path(),
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }
