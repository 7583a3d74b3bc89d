"""Decode speed of large random targets and what bounds it (issue 9): step time, tok/s, bytes read
and % of the HBM roofline per (shape, format, B, context); verify width; attention over the cache
(XLA einsum / the attention kernel / XLA SDPA / cuDNN); loop overhead with and without XLA command
buffers; decode under arms of XLA_FLAGS, fused projections and attention path (kernel or XLA),
legs interleaved; cold and cached compile; the decode step's kernels from a profiler trace. Models
decode with fused q/k/v and gate/up unless --config.fuse=False. Prints Markdown tables; one JSON
row per cell in --out/results.jsonl. The benchmark's modules: specdec/bench/decode.py.

  python -m experiments.bench_decode --config=configs/bench_decode.py --out=runs/bench_decode

On a GPU the parent must not preallocate (XLA_PYTHON_CLIENT_PREALLOCATE=false), or the subprocess
parts find no memory. The whole default config takes well over 10 minutes of H200 time (compiles
dominate), so runs list the parts in priority order under a wall-clock budget (--config.budget_s;
cells past it are recorded as skipped). Each figure's command: docs/benchmarks.md.
"""

from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from specdec import xla_env
from specdec.bench import decode, decode_config, decode_report

_CONFIG = config_flags.DEFINE_config_file("config", "configs/bench_decode.py")
_OUT = flags.DEFINE_string("out", "runs/bench_decode", "directory for results.jsonl and HLO dumps")


def main(argv):
  del argv
  xla_env.apply_defaults()
  cfg = _CONFIG.value
  decode_config.validate(cfg)
  rows = decode.Runner(cfg, _OUT.value).run()
  table = decode_report.markdown(rows)
  Path(_OUT.value, "table.md").write_text(table + "\n")
  print(table)


if __name__ == "__main__":
  app.run(main)
