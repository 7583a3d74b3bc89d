"""Measures the zoo's quality table (docs/zoo.md): perplexity, HumanEval syntax rate, tau.

python -m experiments.zoo_quality --corpus_dir=runs/corpus [--n_humaneval=164] [--zoo_dir=DIR]

--zoo_dir measures a zoo that is not (yet) the shipped one, e.g. a build in progress: every learned
drafter whose directory it holds is measured against its target. --models picks drafters there,
issue 23's ablations (configs/ablations.py) among them; --n_humaneval=0 skips the target's syntax
rate and a missing --corpus_dir its perplexity. The hybrid target's drafters (hybrid_mtp) are
measured against it, under "hybrid" (its perplexity and tau table).
"""

import json
import os

import jax.numpy as jnp
import numpy as np
from absl import app, flags

import specdec
from configs import ablations
from specdec import xla_env
from specdec.checkpoint.zoo import ZOO_DIR
from specdec.lab import zoo_quality
from specdec.training.zoo import DRAFTERS, target_of

_CORPUS = flags.DEFINE_string("corpus_dir", None, "build_corpus output with heldout.npy")
_N = flags.DEFINE_integer("n_humaneval", 164, "HumanEval prompts for the syntax rate")
_TAU_PROMPTS = flags.DEFINE_integer("tau_prompts", 16, "HumanEval prompts for the tau table")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "model dtype")
_ZOO = flags.DEFINE_string("zoo_dir", ZOO_DIR, "the zoo to measure (target/, draft_lm/, drafters)")
_MODELS = flags.DEFINE_list("models", None, "drafters to measure (default: the zoo's in --zoo_dir)")
_DRAFTERS = [m for ds in DRAFTERS.values() for m in ds]
flags.register_validator(
  "models",
  lambda names: names is None or set(names) <= {*_DRAFTERS, *ablations.ABLATIONS},
  f"--models: each must be one of {', '.join(_DRAFTERS)} or an ablation "
  f"({', '.join(ablations.ABLATIONS)})",
)


def zoo(name: str) -> str:
  return os.path.join(_ZOO.value, name)


def main(argv):
  del argv
  xla_env.apply_defaults()
  dtype = jnp.dtype(_DTYPE.value)
  names = _MODELS.value or [m for m in _DRAFTERS if os.path.isdir(zoo(m))]
  kinds = {name: ablations.kinds().get(name, name) for name in names}
  missing = [zoo(name) for name in names if not os.path.isdir(zoo(name))]
  if missing:
    raise app.UsageError(f"--models: no such drafter directory: {', '.join(missing)}")
  hybrid = [name for name in names if target_of(kinds[name]) == "hybrid"]
  names = [name for name in names if name not in hybrid]
  target = specdec.load(zoo("target"), dtype=dtype)
  out = {}
  if _CORPUS.value:
    held = np.load(f"{_CORPUS.value}/heldout.npy")
    out["ppl"] = {"target": zoo_quality.heldout_ppl(target, held)}
    if "draft_lm" in names:
      draft = specdec.load(zoo("draft_lm"), dtype=dtype)
      out["ppl"]["draft_lm"] = zoo_quality.heldout_ppl(draft, held)
  if _N.value:
    parse, body = zoo_quality.humaneval_syntax(target, n=_N.value)
    out["humaneval_parse"], out["humaneval_parse_nonempty"] = parse, body
  drafters = {"ngram": specdec.drafters.ngram()}
  for name in names:
    if kinds[name] == "draft_lm":
      drafters[name] = specdec.drafters.draft_lm(specdec.load(zoo(name), dtype=dtype))
    else:
      drafters[name] = specdec.load_drafter(zoo(name), target)
  out["tau"] = zoo_quality.tau_table(target, drafters, n_prompts=_TAU_PROMPTS.value, kinds=kinds)
  out["bars"] = zoo_quality.bar_checks(out["tau"])
  if hybrid:
    model = specdec.load(zoo("hybrid"), dtype=dtype)
    heads = {"ngram": specdec.drafters.ngram()}
    heads |= {name: specdec.load_drafter(zoo(name), model) for name in hybrid}
    out["hybrid"] = {
      "ppl": zoo_quality.heldout_ppl(model, held) if _CORPUS.value else None,
      "tau": zoo_quality.tau_table(model, heads, n_prompts=_TAU_PROMPTS.value, kinds=kinds),
    }
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  app.run(main)
