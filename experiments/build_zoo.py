"""Retrains the whole tiny zoo, seeded: target, draft LM, MTP, EAGLE-3, block b=8 and b=16.

  python -m experiments.build_corpus --out_dir runs/corpus --tokens --include_tests  # any Python
  python -m experiments.build_zoo --corpus_dir=runs/corpus --out=specdec/zoo   # on the GPU

The drafters train against the target this run exports, read back from --out. A model whose
directory in --out already holds training.json (written last, when its training has finished) is
kept, so a run cut short resumes at the first unfinished model; --retrain starts from scratch.
Time on one H200: docs/zoo.md.
"""

import os

from absl import app, flags, logging

from configs import (
  train_block8,
  train_block16,
  train_draft_lm,
  train_eagle3,
  train_mtp,
  train_target,
)
from specdec.training import drafter, lm

_CORPUS = flags.DEFINE_string("corpus_dir", None, "build_corpus output", required=True)
_OUT = flags.DEFINE_string("out", "specdec/zoo", "zoo directory")
_CKPT = flags.DEFINE_string("ckpt_dir", "/tmp/zoo_ckpt", "checkpoints (a re-run resumes)")
_RETRAIN = flags.DEFINE_bool("retrain", False, "retrain models that --out already holds finished")


def finished(path: str) -> bool:
  """Whether `path` holds a model whose training ran to the end (training.json is written last)."""
  return os.path.exists(os.path.join(path, "training.json"))


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  out, ckpt, corpus = _OUT.value, _CKPT.value, _CORPUS.value
  todo = lambda name: _RETRAIN.value or not finished(f"{out}/{name}")  # noqa: E731
  if todo("target"):
    lm.train(train_target.get_config(), corpus, f"{out}/target", f"{ckpt}/target")
  if todo("draft_lm"):
    draft_cfg = train_draft_lm.get_config()
    draft_cfg.teacher = f"{out}/target"
    lm.train(draft_cfg, corpus, f"{out}/draft_lm", f"{ckpt}/draft_lm")
  drafters = {"mtp": train_mtp, "eagle3": train_eagle3, "block8": train_block8}
  for name, module in {**drafters, "block16": train_block16}.items():
    if not todo(name):
      continue
    cfg = module.get_config()
    cfg.target = os.path.abspath(f"{out}/target")
    drafter.train(cfg, corpus, f"{out}/{name}", f"{ckpt}/{name}")


if __name__ == "__main__":
  app.run(main)
