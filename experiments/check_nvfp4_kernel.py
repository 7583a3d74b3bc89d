"""On a GPU: the NVFP4 kernel inside the model (decode M = 1, verify M = k+1), against plain
decoding and against the dequantized-bf16 twin (docs/benchmarks.md).

  python -m experiments.check_nvfp4_kernel
"""

import jax.numpy as jnp
import numpy as np
from absl import app

import specdec
from specdec.data import workload
from specdec.quant.apply import dequantized_twin, quantize_model
from specdec.sweep import resolve_path


def main(argv):
  del argv
  target = specdec.load(resolve_path("zoo:target"), dtype=jnp.bfloat16)
  q = quantize_model(target, "nvfp4")
  twin = dequantized_twin(q)
  prompts = [p.text for p in workload.load_humaneval()[:6]]
  ids = np.array([target.encode(prompts[0])[:8]])
  a, b = np.asarray(q.logits(ids)), np.asarray(twin.logits(ids))
  print(f"M=8 logits vs twin: max|d| {np.abs(a - b).max():.4f} of max {np.abs(b).max():.3f}")
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
