"""Decode speed of large random targets and what bounds it (issue 9): step time, tok/s, bytes read
and % of the HBM roofline per (shape, format, B, context); verify width; attention over the cache
(XLA einsum / the attention kernel / XLA SDPA / cuDNN); loop overhead with and without XLA command
buffers; decode under arms of XLA_FLAGS, fused projections and attention path (kernel or XLA),
legs interleaved; cold and cached compile; the decode step's kernels from a profiler trace. Models
decode with fused q/k/v and gate/up unless --config.fuse=False. Prints Markdown tables; one JSON
row per cell in --out/results.jsonl.

  python -m experiments.bench_decode --config=configs/decode.py --out=runs/bench_decode

On the H200 (the GPU python3 lacks ml_collections; the parent must not preallocate, or the
subprocess parts find no memory). The 2026-11-30 figures in docs/benchmarks.md came from three
runs of this, the parts in priority order under a wall-clock budget (--config.budget_s; cells past
it are recorded as skipped):
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:. && \
  XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m experiments.bench_decode \
    --config=configs/decode.py --out=$OUT --config.budget_s=200 \
    --config.parts="('copy','decode.bf16','decode.nvfp4','compile','loop')"
  ... --config.budget_s=110 --config.parts="('copy','loop','attention','compile')" \
    --config.attention.widths="(1,4,16)" --config.attention.impls="('xla','cudnn','cudnn_seqlen')"
  ... --config.parts="('compile',)"
Session 3's runs (profile, flags, fused decode rows, verify) are listed in docs/benchmarks.md.
The whole default config needs well over 10 minutes of H200 time (compiles dominate: ~8-11 s per
8B-shape executable, ~17-19 s per 27B-shape one).
"""

from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from specdec import xla_env
from specdec.bench import decode

_CONFIG = config_flags.DEFINE_config_file("config", "configs/decode.py")
_OUT = flags.DEFINE_string("out", "runs/bench_decode", "directory for results.jsonl and HLO dumps")


def main(argv):
  del argv
  xla_env.apply_defaults()
  cfg = _CONFIG.value
  decode.validate(cfg)
  rows = decode.Runner(cfg, _OUT.value).run()
  table = decode.markdown(rows)
  Path(_OUT.value, "table.md").write_text(table + "\n")
  print(table)


if __name__ == "__main__":
  app.run(main)
