"""Retrains the whole tiny zoo, seeded: the target, then its self-distilled data, then the draft LM,
MTP, EAGLE-3, DFlash block b=8 and b=16, DFlash2 and DSpark on that data; then the hybrid target
and its MTP head on the hybrid's own self-distilled data.

  python -m experiments.build_corpus --out_dir runs/corpus --tokens --include_tests  # any Python
  python -m experiments.build_zoo --corpus_dir=runs/corpus --out=specdec/zoo   # on the GPU

A model already finished in --out is kept (specdec.training.zoo), so a run cut short resumes at
the first unfinished model; --retrain starts from scratch. --models picks models: after
`--models=target,selfdistill`, one process per drafter (`--models=eagle3`, ...) can share the
GPU; `--jobs=N` does that itself, N drafters at a time (`--models=hybrid,hybrid_mtp`: the hybrid
pair alone, its data `selfdistill_hybrid`). --models may name issue 23's ablations
(configs/ablations.py), which train against the target in --out like the zoo's drafters.
Time on one H200: docs/zoo.md.
"""

import os
import sys

from absl import app, flags, logging

from configs import ablations
from configs.zoo import CONFIGS
from specdec import xla_env
from specdec.training import zoo

_CORPUS = flags.DEFINE_string("corpus_dir", None, "build_corpus output", required=True)
_OUT = flags.DEFINE_string("out", "specdec/zoo", "zoo directory")
_CKPT = flags.DEFINE_string("ckpt_dir", "/tmp/zoo_ckpt", "checkpoints (a re-run resumes)")
_RETRAIN = flags.DEFINE_bool("retrain", False, "retrain models that --out already holds finished")
_MODELS = flags.DEFINE_list(
  "models",
  list(zoo.MODELS),
  "models to train ('selfdistill', 'selfdistill_hybrid': a target's drafter data alone; "
  "ablations by name)",
)
flags.register_validator(
  "models",
  lambda names: set(names) <= {*zoo.MODELS, *zoo.DATA.values(), *ablations.ABLATIONS},
  f"--models: each must be one of {', '.join((*zoo.MODELS, *zoo.DATA.values()))} or an "
  f"ablation ({', '.join(ablations.ABLATIONS)})",
)
_JOBS = flags.DEFINE_integer(
  "jobs", 1, "> 1: after the target and the data, the drafters train in this many processes at once"
)


def main(argv):
  del argv
  xla_env.apply_defaults()
  logging.set_verbosity(logging.WARNING)
  configs = {name: module.get_config() for name, module in CONFIGS.items()}
  kinds = {name: ablations.kinds()[name] for name in _MODELS.value if name in ablations.ABLATIONS}
  configs.update({name: ablations.get_config(name) for name in kinds})
  models = tuple(_MODELS.value)
  drafters = [m for m in models if zoo.target_of(kinds.get(m, m)) and m not in zoo.DATA.values()]
  if _JOBS.value <= 1 or len(drafters) <= 1:
    zoo.build(configs, _CORPUS.value, _OUT.value, _CKPT.value, _RETRAIN.value, models, kinds)
    return
  # The targets and every drafter's data first, so no two drafters build the same data at once.
  data = {zoo.DATA[zoo.target_of(kinds.get(m, m))] for m in drafters}
  first = tuple(m for m in models if m in zoo.DRAFTERS) + tuple(sorted(data))
  zoo.build(configs, _CORPUS.value, _OUT.value, _CKPT.value, _RETRAIN.value, first, kinds)
  env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # memory as each one needs it
  cmds = {name: drafter_command(name) for name in drafters}
  failed = zoo.side_by_side(cmds, _JOBS.value, _CKPT.value, env)
  if failed:
    sys.exit(f"build_zoo: {', '.join(failed)} failed; their logs are in {_CKPT.value}")


def drafter_command(name: str) -> list[str]:
  """This main for one drafter, with this run's flags."""
  cmd = [sys.executable, "-m", "experiments.build_zoo", f"--models={name}"]
  cmd += [f"--corpus_dir={_CORPUS.value}", f"--out={_OUT.value}", f"--ckpt_dir={_CKPT.value}"]
  return cmd + (["--retrain"] if _RETRAIN.value else [])


if __name__ == "__main__":
  app.run(main)
