"""Self-distillation data: the target's own continuations of corpus prefixes (EAGLE-3, DFlash and
Medusa-2 train their drafters on target-regenerated text, so that the drafter learns what the
verifier will accept, not what the corpus says).

Each row is a corpus prefix of `prompt_tokens` tokens (from evenly spaced, seeded starts) and the
target's continuation of up to `new_tokens`, ended by EOS; the rows are split between the listed
temperatures (greedy rows follow the target's greedy path exactly; sampled rows cover the states
sampling reaches). The rows are concatenated into one uint16 stream, the same shape as the
corpus's train.npy, so every trainer reads it unchanged. The stream is cached beside a JSON record
of its inputs (the target's fingerprint, the settings); a matching record means it is reused, and
both are written to temporary names first, then renamed.
"""

import dataclasses
import json
import os
import time

import numpy as np

from specdec.checkpoint.fingerprint import fingerprint
from specdec.checkpoint.loader import load
from specdec.data.tokenizer import EOS_ID
from specdec.decoding.generate import generate

STREAM, RECORD = "distill.npy", "distill.json"


@dataclasses.dataclass(frozen=True)
class DistillConfig:
  rows: int = 4096
  prompt_tokens: int = 64
  new_tokens: int = 960
  temperatures: tuple[float, ...] = (0.0, 0.6)  # rows split evenly among them, in this order
  batch: int = 256
  seed: int = 0

  def check(self, num_tokens: int) -> "DistillConfig":
    if self.rows < len(self.temperatures) or self.rows % len(self.temperatures):
      raise ValueError(
        f"selfdistill.rows={self.rows}: must be a positive multiple of the "
        f"{len(self.temperatures)} temperatures"
      )
    if min(self.prompt_tokens, self.new_tokens, self.batch) < 1:
      raise ValueError("selfdistill.prompt_tokens, new_tokens and batch must be >= 1")
    if any(t < 0 for t in self.temperatures):
      raise ValueError(f"selfdistill.temperatures={self.temperatures}: must be >= 0")
    if num_tokens < self.prompt_tokens + 1:
      raise ValueError(f"corpus of {num_tokens} tokens has no prefix of {self.prompt_tokens}")
    return self


def prefixes(tokens, cfg: DistillConfig) -> list[list[int]]:
  """cfg.rows corpus prefixes: evenly spaced starts, shuffled by the seed (so each temperature's
  share spans the whole corpus)."""
  starts = np.linspace(0, len(tokens) - cfg.prompt_tokens - 1, cfg.rows).astype(np.int64)
  starts = np.random.default_rng(cfg.seed).permutation(starts)
  return [np.asarray(tokens[s : s + cfg.prompt_tokens]).astype(int).tolist() for s in starts]


def generate_rows(target, tokens, cfg: DistillConfig) -> list[list[int]]:
  """Each prefix followed by the target's continuation (stopped at EOS or new_tokens), then EOS;
  the first rows / len(temperatures) rows at the first temperature, and so on."""
  prompts = prefixes(tokens, cfg.check(len(tokens)))
  per_t = cfg.rows // len(cfg.temperatures)
  rows = []
  for j, t in enumerate(cfg.temperatures):
    share = prompts[j * per_t : (j + 1) * per_t]
    for i in range(0, per_t, cfg.batch):
      chunk = share[i : i + cfg.batch]
      seed = cfg.seed + 1_000_000 * j + i
      g = generate(target, chunk, max_new_tokens=cfg.new_tokens, temperature=t, seed=seed)
      rows += [
        p + [x for x in out if x != EOS_ID] + [EOS_ID]
        for p, out in zip(chunk, g.tokens, strict=True)
      ]
  return rows


def _record(target_path: str, corpus_file: str, cfg: DistillConfig) -> dict:
  return {
    "target_fingerprint": fingerprint(target_path),
    "corpus_file": os.path.abspath(corpus_file),
    "config": dataclasses.asdict(cfg),
  }


def build(target_path: str, corpus_file: str, out_dir: str, cfg: DistillConfig) -> str:
  """The path of the self-distilled stream for (target, corpus, cfg) in out_dir: reused when its
  record matches, generated otherwise (on the default device)."""
  want = json.loads(json.dumps(_record(target_path, corpus_file, cfg)))  # tuples as lists
  stream, record = os.path.join(out_dir, STREAM), os.path.join(out_dir, RECORD)
  if os.path.exists(stream) and os.path.exists(record):
    with open(record) as f:
      have = json.load(f)
    if {k: have.get(k) for k in want} == want:
      return stream
  os.makedirs(out_dir, exist_ok=True)
  t0 = time.perf_counter()
  tokens = np.load(corpus_file, mmap_mode="r")
  rows = generate_rows(load(target_path), tokens, cfg)
  flat = np.fromiter((x for r in rows for x in r), np.uint16)
  np.save(stream + ".tmp.npy", flat)
  generated = int(len(flat) - cfg.rows * (cfg.prompt_tokens + 1))
  stats = {"tokens": int(len(flat)), "generated_tokens": generated}
  with open(record + ".tmp", "w") as f:
    json.dump({**want, **stats, "wall_s": round(time.perf_counter() - t0, 1)}, f, indent=1)
  os.replace(stream + ".tmp.npy", stream)
  os.replace(record + ".tmp", record)
  return stream
