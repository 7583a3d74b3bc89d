"""Retrains the whole tiny zoo, seeded: the target, then its self-distilled data, then the draft LM,
MTP, EAGLE-3, DFlash block b=8 and b=16 and DFlash2 on that data.

  python -m experiments.build_corpus --out_dir runs/corpus --tokens --include_tests  # any Python
  python -m experiments.build_zoo --corpus_dir=runs/corpus --out=specdec/zoo   # on the GPU

A model already finished in --out is kept (specdec.training.zoo), so a run cut short resumes at
the first unfinished model; --retrain starts from scratch. --models picks models: after
`--models=target,selfdistill`, one process per drafter (`--models=eagle3`, ...) can share the GPU.
Time on one H200: docs/zoo.md.
"""

from absl import app, flags, logging

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
  "models to train ('selfdistill': the drafters' data alone)",
)


def main(argv):
  del argv
  xla_env.apply_defaults()
  logging.set_verbosity(logging.WARNING)
  configs = {name: module.get_config() for name, module in CONFIGS.items()}
  models = tuple(_MODELS.value)
  zoo.build(configs, _CORPUS.value, _OUT.value, _CKPT.value, _RETRAIN.value, models)


if __name__ == "__main__":
  app.run(main)
