"""Measures the zoo's quality table (docs/zoo.md): perplexity, HumanEval syntax rate, tau.

python -m experiments.zoo_quality --corpus_dir=runs/corpus [--n_humaneval=164]
"""

import json
import os

import jax.numpy as jnp
import numpy as np
from absl import app, flags

import specdec
from specdec import xla_env
from specdec.checkpoint.zoo import resolve_path
from specdec.lab import zoo_quality

_CORPUS = flags.DEFINE_string("corpus_dir", None, "build_corpus output with heldout.npy")
_N = flags.DEFINE_integer("n_humaneval", 164, "HumanEval prompts for the syntax rate")
_TAU_PROMPTS = flags.DEFINE_integer("tau_prompts", 16, "HumanEval prompts for the tau table")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "model dtype")


def main(argv):
  del argv
  xla_env.apply_defaults()
  dtype = jnp.dtype(_DTYPE.value)
  target = specdec.load(resolve_path("zoo:target"), dtype=dtype)
  draft = specdec.load(resolve_path("zoo:draft_lm"), dtype=dtype)
  out = {}
  if _CORPUS.value:
    held = np.load(f"{_CORPUS.value}/heldout.npy")
    out["ppl"] = {
      "target": zoo_quality.heldout_ppl(target, held),
      "draft_lm": zoo_quality.heldout_ppl(draft, held),
    }
  parse, body = zoo_quality.humaneval_syntax(target, n=_N.value)
  out["humaneval_parse"], out["humaneval_parse_nonempty"] = parse, body
  d = specdec.drafters
  drafters = {
    "ngram": d.ngram(),
    "draft_lm": d.draft_lm(draft),
    "mtp": d.load_mtp(resolve_path("zoo:mtp"), target),
    "eagle3": d.load_eagle3(resolve_path("zoo:eagle3"), target),
    "block8": d.load_block(resolve_path("zoo:block8"), target),
    "block16": d.load_block(resolve_path("zoo:block16"), target),
  }
  if os.path.isdir(resolve_path("zoo:dflash2")):
    drafters["dflash2"] = d.load_block(resolve_path("zoo:dflash2"), target)
  out["tau"] = zoo_quality.tau_table(target, drafters, n_prompts=_TAU_PROMPTS.value)
  out["bars"] = zoo_quality.bar_checks(out["tau"])
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  app.run(main)
