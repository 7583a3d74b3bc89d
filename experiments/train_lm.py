"""Trains a zoo LM (the target, or the draft LM distilled from it) and exports it in the HF layout.

  python -m experiments.train_lm --config=configs/train_target.py --corpus_dir=runs/corpus \
      --out=runs/zoo/target [--config.steps=20]

--corpus_dir is `python -m experiments.build_corpus --tokens` output. --out gets config.json,
model.safetensors, tokenizer.json (specdec.load reads it), export.json and training.json (config,
history, device). Orbax checkpoints go to --ckpt_dir (default <out>_ckpt); a re-run resumes there.
"""

import json
from pathlib import Path

from absl import app, flags, logging
from ml_collections import config_flags

from specdec import xla_env
from specdec.training import lm

_CONFIG = config_flags.DEFINE_config_file("config", "configs/train_target.py", "training config")
_OUT = flags.DEFINE_string("out", None, "export directory", required=True)
_CORPUS = flags.DEFINE_string(
  "corpus_dir", None, "train.npy, heldout.npy, tokenizer.json", required=True
)
_CKPT = flags.DEFINE_string("ckpt_dir", None, "checkpoint directory (default <out>_ckpt)")


def main(argv):
  del argv
  xla_env.apply_defaults()
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint file at INFO
  lm.train(_CONFIG.value, _CORPUS.value, _OUT.value, _CKPT.value)
  record = json.loads((Path(_OUT.value) / "training.json").read_text())
  print(f"{_OUT.value}: {record['params']} params, exported {record['exported']}")


if __name__ == "__main__":
  app.run(main)
