"""Distills a learned drafter against the frozen target and exports its published layout.

  python -m experiments.train_drafter --config=configs/train_block8.py --corpus_dir=runs/corpus \
      --out=specdec/zoo/block8
"""

from absl import app, flags, logging
from ml_collections import config_flags

from specdec import xla_env
from specdec.training import drafter

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "drafter training config", lock_config=False
)
_OUT = flags.DEFINE_string("out", None, "export directory", required=True)
_CORPUS = flags.DEFINE_string("corpus_dir", None, "build_corpus output", required=True)
_CKPT = flags.DEFINE_string("ckpt_dir", None, "checkpoints (default <out>_ckpt); a re-run resumes")


def main(argv):
  del argv
  xla_env.apply_defaults()
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  history = drafter.train(_CONFIG.value, _CORPUS.value, _OUT.value, _CKPT.value)
  print(f"exported {_OUT.value}: {history['eval'][-1] if history['eval'] else {}}")


if __name__ == "__main__":
  app.run(main)
