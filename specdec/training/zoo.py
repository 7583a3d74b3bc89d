"""The tiny zoo's build: its models in training order, each skipped once it has finished.

The zoo has two targets, trained on the corpus: `target` (Qwen3, dense) and `hybrid` (Qwen3-Next:
Gated DeltaNet and gated attention, issue 25); every other model is a drafter of one of them.
Before a target's first drafter, the target's own continuations of corpus prefixes are generated
(`selfdistill`, cached in the checkpoint directory, not shipped), and its drafters train on them:
a draft LM distils the target's logits there, the heads train against the target read back from
the zoo directory. A model counts as finished when its directory holds training.json, which
training writes last, so a build cut short resumes at the first unfinished model.
"""

import json
import os
import subprocess
import time

from specdec.training import drafter, lm, selfdistill

# Each target and its drafters, in training order.
DRAFTERS = {
  "target": ("draft_lm", "mtp", "eagle3", "block8", "block16", "dflash2", "dspark"),
  "hybrid": ("hybrid_mtp",),
}
MODELS = tuple(m for target, drafters in DRAFTERS.items() for m in (target, *drafters))
# Each target's self-distilled data, a pseudo-model of `models` ("build that data alone").
DATA = {"target": "selfdistill", "hybrid": "selfdistill_hybrid"}
SELF_DISTILLED = "self_distilled"  # a drafter config key: False trains on the corpus instead
DRAFT_LMS = ("draft_lm",)  # drafters distilled by lm.train (the others are heads: drafter.train)


def finished(path: str) -> bool:
  return os.path.exists(os.path.join(path, "training.json"))


def target_of(model: str) -> str | None:
  """The target a zoo model (or a target's data) trains against; None for a target."""
  if model in DRAFTERS:
    return None
  data = {name: target for target, name in DATA.items()}
  return data.get(model) or next(t for t, ds in DRAFTERS.items() if model in ds)


def share_tokenizer(path: str, target: str) -> None:
  """Replaces path/tokenizer.json by a relative link to the target's where both hold the same
  tokenizer, so the zoo ships one copy (0.5 MiB)."""
  mine, theirs = (os.path.join(p, "tokenizer.json") for p in (path, target))
  if not (os.path.isfile(mine) and os.path.isfile(theirs)) or os.path.islink(mine):
    return
  with open(mine) as a, open(theirs) as b:
    if json.load(a) != json.load(b):
      return
  os.remove(mine)
  os.symlink(os.path.relpath(theirs, path), mine)


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
  the drafters' data, and a name of `DATA` in `models` builds that target's data alone. Separate
  processes can so train the drafters side by side once the targets and the data exist. `kinds`
  names models outside the zoo (ablations) and the zoo model each trains as; they train after the
  zoo's, into out/NAME, against that model's target. Returns the names trained, in order."""
  kinds = {**{name: name for name in MODELS}, **(kinds or {})}
  unknown = sorted(set(models) - {*kinds, *DATA.values()})
  if unknown:
    raise ValueError(f"zoo models {unknown}: not among {(*kinds, *DATA.values())}")
  if any(kinds[name] in DRAFTERS for name in set(kinds) - set(MODELS)):
    raise ValueError("zoo models: an ablation of a target would not be its drafters' target")
  for name in models:
    target = target_of(kinds.get(name, name))
    if target and target not in models and not finished(os.path.join(out, target)):
      raise ValueError(
        f"{os.path.join(out, target)}: the target of {name} is not finished; build it first "
        f"(models={target})"
      )
  streams = {}

  def stream(target: str) -> str:
    """The target's self-distilled stream, built once."""
    if target not in streams:
      sd = selfdistill.DistillConfig(**dict(configs["selfdistill"]))
      corpus = os.path.join(corpus_dir, "train.npy")
      data_dir = os.path.join(ckpt_dir, DATA[target])
      streams[target] = selfdistill.build(os.path.join(out, target), corpus, data_dir, sd)
    return streams[target]

  trained = []
  for name in (*kinds, *DATA.values()):
    path, ckpt = os.path.join(out, name), os.path.join(ckpt_dir, name)
    if name not in models or (name in kinds and finished(path) and not retrain):
      continue
    if name in DATA.values():
      stream(target_of(name))
      continue
    cfg, model = configs[name], kinds[name]
    target = target_of(model)
    if target is None:
      lm.train(cfg, corpus_dir, path, ckpt)
      if name != "target":
        share_tokenizer(path, os.path.join(out, "target"))
      trained.append(name)
      continue
    if cfg.get(SELF_DISTILLED, True):
      cfg.train_file = os.path.abspath(stream(target))
    if model in DRAFT_LMS:
      cfg.teacher = os.path.join(out, target)
      lm.train(cfg, corpus_dir, path, ckpt)
      share_tokenizer(path, cfg.teacher)
    else:
      cfg.target = os.path.abspath(os.path.join(out, target))
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
