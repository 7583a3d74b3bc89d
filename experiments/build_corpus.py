"""Builds the tiny-zoo corpus: manifest, tokenizer and (optionally) token arrays.

  python -m experiments.build_corpus --out_dir runs/corpus [--tokens] [--include_tests]

writes manifest.json (every file's path, sha256 and split), tokenizer.json, stats.json and, with
--tokens, train.npy / heldout.npy: uint16 token streams, each document followed by EOS (id 0).
"""

import json
import time
from pathlib import Path

import numpy as np
from absl import app, flags

from specdec.data import corpus, tokenizer

_OUT_DIR = flags.DEFINE_string("out_dir", None, "where the outputs go", required=True)
_VOCAB = flags.DEFINE_integer("vocab_size", tokenizer.VOCAB_SIZE, "BPE vocabulary size")
_HELDOUT = flags.DEFINE_float("heldout_fraction", corpus.HELDOUT_FRACTION, "files held out")
_TOKENS = flags.DEFINE_bool("tokens", False, "also write train.npy and heldout.npy (uint16)")
_TESTS = flags.DEFINE_bool("include_tests", False, "take the stdlib's test suites in too")


def main(argv):
  del argv
  out = Path(_OUT_DIR.value)
  out.mkdir(parents=True, exist_ok=True)

  corp = corpus.build_corpus(heldout_fraction=_HELDOUT.value, include_tests=_TESTS.value)
  corp.write_manifest(out / "manifest.json")
  leaks = corp.humaneval["collisions"]
  print(f"corpus: {corp.stats()}  HumanEval collisions: {len(leaks)}")

  t0 = time.perf_counter()
  tok = tokenizer.train_tokenizer(corp.texts("train"), vocab_size=_VOCAB.value)
  train_s = time.perf_counter() - t0
  tokenizer.save_tokenizer(tok, out / "tokenizer.json")
  bpt, n_bytes, n_tokens = tokenizer.bytes_per_token(tok, corp.texts("heldout"))
  print(
    f"tokenizer: vocab {tok.get_vocab_size()}, trained in {train_s:.1f}s, "
    f"held-out {bpt:.3f} bytes/token"
  )

  stats = {
    "corpus": corp.stats(),
    "humaneval_collisions": len(leaks),
    "vocab_size": tok.get_vocab_size(),
    "tokenizer_train_seconds": round(train_s, 2),
    "heldout_bytes_per_token": bpt,
    "heldout_bytes": n_bytes,
    "heldout_tokens": n_tokens,
  }
  if _TOKENS.value:
    for split in corpus.SPLITS:
      ids = tokenizer.encode_documents(tok, corp.texts(split))
      np.save(out / f"{split}.npy", ids)
      stats[f"{split}_tokens"] = int(ids.size)
      print(f"{split}.npy: {ids.size} tokens")
  (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")


if __name__ == "__main__":
  app.run(main)
