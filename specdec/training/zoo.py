"""The tiny zoo's build: its models in training order, each skipped once it has finished.

The target comes first; the draft LM distils from it and the heads train against it, both read
back from the zoo directory. A model counts as finished when its directory holds training.json,
which training writes last, so a build cut short resumes at the first unfinished model.
"""

import os

from specdec.training import drafter, lm

MODELS = ("target", "draft_lm", "mtp", "eagle3", "block8", "block16")


def finished(path: str) -> bool:
  return os.path.exists(os.path.join(path, "training.json"))


def build(configs: dict, corpus_dir: str, out: str, ckpt_dir: str, retrain: bool = False):
  """Trains every model of MODELS (configs[name]: its training config) that `out` does not hold
  finished (all of them with `retrain`); returns the names trained, in order."""
  target = os.path.join(out, "target")
  trained = []
  for name in MODELS:
    path, ckpt = os.path.join(out, name), os.path.join(ckpt_dir, name)
    if finished(path) and not retrain:
      continue
    cfg = configs[name]
    if name == "target":
      lm.train(cfg, corpus_dir, path, ckpt)
    elif name == "draft_lm":
      cfg.teacher = target
      lm.train(cfg, corpus_dir, path, ckpt)
    else:
      cfg.target = os.path.abspath(target)
      drafter.train(cfg, corpus_dir, path, ckpt)
    trained.append(name)
  return trained
