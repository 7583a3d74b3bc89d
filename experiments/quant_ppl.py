"""Held-out perplexity of the zoo target against its quantized variants (docs/zoo.md).

python -m experiments.quant_ppl --corpus_dir=runs/corpus [--formats=nvfp4,fp8,exl3_4,exl3_3]
"""

import time

import jax.numpy as jnp
import numpy as np
from absl import app, flags

import specdec
from specdec import xla_env
from specdec.checkpoint.zoo import resolve_path
from specdec.lab.zoo_quality import heldout_ppl
from specdec.models.fuse import quantized

_CORPUS = flags.DEFINE_string("corpus_dir", None, "build_corpus output", required=True)
_FORMATS = flags.DEFINE_list("formats", ["nvfp4", "fp8", "exl3_4", "exl3_3"], "formats")


def main(argv):
  del argv
  xla_env.apply_defaults()
  held = np.load(f"{_CORPUS.value}/heldout.npy")
  target = specdec.load(resolve_path("zoo:target"), dtype=jnp.bfloat16)
  base = heldout_ppl(target, held)
  print(f"bf16 ppl {base:.4f}")
  for fmt in _FORMATS.value:
    t = time.perf_counter()
    q = quantized(target, fmt)
    took = time.perf_counter() - t
    ppl = heldout_ppl(q, held)
    print(f"{fmt} ppl {ppl:.4f} ({100 * (ppl / base - 1):+.2f}%) quantize {took:.1f} s")


if __name__ == "__main__":
  app.run(main)
