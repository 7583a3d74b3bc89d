"""Measures the zoo's quality table (docs/zoo.md): perplexity, HumanEval syntax rate, tau.

python -m experiments.zoo_quality --corpus_dir=runs/corpus [--n_humaneval=164] [--zoo_dir=DIR]

--zoo_dir measures a zoo that is not (yet) the shipped one, e.g. a build in progress: every learned
drafter whose directory it holds is measured against its target.
"""

import json
import os

import jax.numpy as jnp
import numpy as np
from absl import app, flags

import specdec
from specdec import xla_env
from specdec.checkpoint.zoo import ZOO_DIR
from specdec.lab import zoo_quality
from specdec.training.zoo import MODELS

_CORPUS = flags.DEFINE_string("corpus_dir", None, "build_corpus output with heldout.npy")
_N = flags.DEFINE_integer("n_humaneval", 164, "HumanEval prompts for the syntax rate")
_TAU_PROMPTS = flags.DEFINE_integer("tau_prompts", 16, "HumanEval prompts for the tau table")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "model dtype")
_ZOO = flags.DEFINE_string("zoo_dir", ZOO_DIR, "the zoo to measure (target/, draft_lm/, drafters)")


def zoo(name: str) -> str:
  return os.path.join(_ZOO.value, name)


def main(argv):
  del argv
  xla_env.apply_defaults()
  dtype = jnp.dtype(_DTYPE.value)
  target = specdec.load(zoo("target"), dtype=dtype)
  draft = specdec.load(zoo("draft_lm"), dtype=dtype)
  out = {}
  if _CORPUS.value:
    held = np.load(f"{_CORPUS.value}/heldout.npy")
    out["ppl"] = {
      "target": zoo_quality.heldout_ppl(target, held),
      "draft_lm": zoo_quality.heldout_ppl(draft, held),
    }
  parse, body = zoo_quality.humaneval_syntax(target, n=_N.value)
  out["humaneval_parse"], out["humaneval_parse_nonempty"] = parse, body
  drafters = {"ngram": specdec.drafters.ngram(), "draft_lm": specdec.drafters.draft_lm(draft)}
  for name in MODELS:
    if name not in drafters and name != "target" and os.path.isdir(zoo(name)):
      drafters[name] = specdec.load_drafter(zoo(name), target)
  out["tau"] = zoo_quality.tau_table(target, drafters, n_prompts=_TAU_PROMPTS.value)
  out["bars"] = zoo_quality.bar_checks(out["tau"])
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  app.run(main)
