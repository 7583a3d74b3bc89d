"""The tiny zoo's build: its models in training order, each skipped once it has finished.

The target comes first. Then the target's own continuations of corpus prefixes are generated
(`selfdistill`, cached in the checkpoint directory, not shipped), and every drafter trains on them:
the draft LM distils the target's logits there, the heads train against the target read back from
the zoo directory. A model counts as finished when its directory holds training.json, which
training writes last, so a build cut short resumes at the first unfinished model.
"""

import os
import subprocess
import time

from specdec.training import drafter, lm, selfdistill

MODELS = ("target", "draft_lm", "mtp", "eagle3", "block8", "block16", "dflash2", "dspark")
SELF_DISTILLED = "self_distilled"  # a drafter config key: False trains on the corpus instead


def finished(path: str) -> bool:
  return os.path.exists(os.path.join(path, "training.json"))


def build(
  configs: dict,
  corpus_dir: str,
  out: str,
  ckpt_dir: str,
  retrain: bool = False,
  models: tuple[str, ...] = MODELS,
  kinds: dict[str, str] | None = None,
):
  """Trains every model of `models` (configs[name]: its training config) that `out` does not hold
  finished (all of them with `retrain`); configs["selfdistill"] (a DistillConfig's fields) sets
  the drafters' data, and "selfdistill" in `models` builds that data alone. Separate processes
  can so train the drafters side by side once the target and the data exist. `kinds` names
  models outside the zoo (ablations) and the zoo model each trains as; they train after the
  zoo's, into out/NAME. Returns the names trained, in order."""
  kinds = {**{name: name for name in MODELS}, **(kinds or {})}
  unknown = sorted(set(models) - {*kinds, "selfdistill"})
  if unknown:
    raise ValueError(f"zoo models {unknown}: not among {(*kinds, 'selfdistill')}")
  if any(kinds[name] == "target" for name in set(kinds) - set(MODELS)):
    raise ValueError("zoo models: an ablation of the target would not be the drafters' target")
  target = os.path.join(out, "target")
  if "target" not in models and not finished(target):
    raise ValueError(f"{target}: the target is not finished; build it first (models=target)")
  trained, stream = [], None
  for name in (*kinds, "selfdistill"):
    path, ckpt = os.path.join(out, name), os.path.join(ckpt_dir, name)
    if name not in models or (finished(path) and not retrain):
      continue
    cfg = configs[name]
    if name == "target":
      lm.train(cfg, corpus_dir, path, ckpt)
      trained.append(name)
      continue
    if stream is None:
      sd = selfdistill.DistillConfig(**dict(configs["selfdistill"]))
      corpus = os.path.join(corpus_dir, "train.npy")
      stream = selfdistill.build(target, corpus, os.path.join(ckpt_dir, "selfdistill"), sd)
    if name == "selfdistill":
      continue
    if cfg.get(SELF_DISTILLED, True):
      cfg.train_file = os.path.abspath(stream)
    if kinds[name] == "draft_lm":
      cfg.teacher = target
      lm.train(cfg, corpus_dir, path, ckpt)
    else:
      cfg.target = os.path.abspath(target)
      drafter.train(cfg, corpus_dir, path, ckpt)
    trained.append(name)
  return trained


def side_by_side(
  cmds: dict[str, list[str]], jobs: int, log_dir: str, env=None, retry_alone: bool = True
) -> list[str]:
  """Runs each command (by name) as its own process, `jobs` at a time, logging to
  log_dir/NAME.log: the drafters of a build share one device once the target and the data exist.
  With retry_alone, a command that failed beside others runs again alone once they are done
  (logging to NAME.retry.log; a trainer resumes from its checkpoint): sharing a device's memory
  is the usual cause (on an 80 GB card, 7 drafters at once ran two out of memory). Returns the
  names whose process failed (alone, with retry_alone)."""
  os.makedirs(log_dir, exist_ok=True)
  pending, running, failed = list(cmds), {}, []
  while pending or running:
    while pending and len(running) < jobs:
      name = pending.pop(0)
      log = open(os.path.join(log_dir, f"{name}.log"), "w")
      proc = subprocess.Popen(cmds[name], stdout=log, stderr=subprocess.STDOUT, env=env)
      running[name] = (proc, log)
      print(f"zoo: {name} started, log {log.name}", flush=True)
    time.sleep(0.2)
    for name, (proc, log) in list(running.items()):
      if proc.poll() is not None:
        log.close()
        del running[name]
        print(f"zoo: {name} exited with {proc.returncode}", flush=True)
        failed += [name] if proc.returncode else []
  if not (retry_alone and jobs > 1 and failed):
    return failed
  again = {f"{name}.retry": cmds[name] for name in failed}
  return [name.removesuffix(".retry") for name in side_by_side(again, 1, log_dir, env, False)]
