"""On a GPU: a quantized-weight kernel inside the model (decode M = 1, verify M = k+1), against
plain decoding and against the dequantized-bf16 twin (docs/benchmarks.md). The twin computes what
the weight's XLA fallback computes (dequantize to bf16, XLA dot), so "twin-equal" is the gate
"same greedy tokens with and without the kernel".

  python -m experiments.check_nvfp4_kernel [--format=fp8] [--prompts=6]
"""

import jax.numpy as jnp
import numpy as np
from absl import app, flags

import specdec
from specdec.data import workload
from specdec.quant.apply import dequantized_twin, quantize_model
from specdec.sweep import resolve_path

_FORMAT = flags.DEFINE_enum("format", "nvfp4", ["nvfp4", "fp8"], "formats with a GEMV kernel")
_PROMPTS = flags.DEFINE_integer("prompts", 6, "HumanEval prompts to generate from")


def main(argv):
  del argv
  target = specdec.load(resolve_path("zoo:target"), dtype=jnp.bfloat16)
  q = quantize_model(target, _FORMAT.value)
  twin = dequantized_twin(q)
  prompts = [p.text for p in workload.load_humaneval()[: _PROMPTS.value]]
  ids = np.array([target.encode(prompts[0])[:8]])
  a, b = np.asarray(q.logits(ids)), np.asarray(twin.logits(ids))
  d = np.abs(a - b).max()
  print(f"{_FORMAT.value} M=8 logits vs twin: max|d| {d:.4f} of max {np.abs(b).max():.3f}")
  for p in prompts:
    base = specdec.generate(q, [p], max_new_tokens=48)
    spec = specdec.generate(q, [p], max_new_tokens=48, drafter=specdec.drafters.ngram(), k=4)
    same = specdec.generate(
      q, [p], max_new_tokens=48, drafter=specdec.drafters.ngram(), k=4, acceptance="reject"
    )
    tw = specdec.generate(twin, [p], max_new_tokens=48)
    print(
      f"gate {spec.tokens == base.tokens} same-shape {same.tokens == base.tokens} "
      f"twin-equal {tw.tokens == base.tokens} tau {spec.stats['tau']:.2f}"
    )


if __name__ == "__main__":
  app.run(main)
