"""Writes the zoo target's quantized variants as checkpoints in the HF layout the loader reads.

  python -m experiments.export_quant_zoo --out=runs/zoo_quant [--formats=nvfp4,fp8,exl3_3,exl3_4]

They are not shipped in specdec/zoo (its 32 MiB budget would not hold them: each keeps the 4 MiB
bf16 embedding); this makes them on any machine, seeded. Each one is read back and must give the
logits of the in-memory model exactly, so a written file is never a different model.
"""

import os
import time

import jax.numpy as jnp
import numpy as np
from absl import app, flags

import specdec
from specdec import xla_env
from specdec.checkpoint.zoo import resolve_path
from specdec.quant.apply import FORMATS, quantize_model

_OUT = flags.DEFINE_string("out", None, "directory for target_<format>/", required=True)
_FORMATS = flags.DEFINE_list("formats", ["nvfp4", "fp8", "exl3_3", "exl3_4"], f"of {FORMATS}")
_LAYOUT = flags.DEFINE_enum("layout", "modelopt", ["modelopt", "compressed-tensors"], "NVFP4/FP8")


def export(target, fmt: str, out_dir: str, layout: str) -> dict:
  t0 = time.perf_counter()
  q = quantize_model(target, fmt)
  quantize_s = time.perf_counter() - t0
  path = os.path.join(out_dir, f"target_{fmt}")
  specdec.save(path, q, layout=layout)
  back = specdec.load(path, dtype=target.dtype, fuse_projections=False)
  ids = np.array([target.encode("def fib(n):\n    return")])
  if not np.array_equal(np.asarray(q.logits(ids)), np.asarray(back.logits(ids))):
    raise AssertionError(f"{path}: read back, the logits differ from the quantized model's")
  size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
  return dict(format=fmt, path=path, mib=size / 2**20, quantize_s=quantize_s)


def main(argv):
  del argv
  xla_env.apply_defaults()
  bad = sorted(set(_FORMATS.value) - set(FORMATS))
  if bad:
    raise app.UsageError(f"--formats: unknown {bad}; choose from {FORMATS}")
  target = specdec.load(resolve_path("zoo:target"), dtype=jnp.bfloat16, fuse_projections=False)
  for fmt in _FORMATS.value:
    r = export(target, fmt, _OUT.value, _LAYOUT.value)
    print(f"{r['format']}: {r['path']} {r['mib']:.2f} MiB, quantized in {r['quantize_s']:.1f} s")


if __name__ == "__main__":
  app.run(main)
