"""HF transformers against specdec on one machine: same weights, same prompts, interleaved legs.

  python -m experiments.bench_peers [--config=configs/bench_peers.py] [--config.parts=zoo] \
      [--config.torch_python=.venv-ref/bin/python] --out=runs/peers

Prints a Markdown table per part (both rate conventions, spread between legs, the greedy gate,
token agreement with specdec's greedy decode) and writes OUT/results.jsonl and OUT/peers.md.
transformers runs in a worker process (specdec/bench/peers_torch.py); see specdec/bench/peers.py.
"""

from absl import app, flags
from ml_collections import config_flags

from specdec import xla_env
from specdec.bench import peers

_CONFIG = config_flags.DEFINE_config_file("config", "configs/bench_peers.py", "peer bench config")
_OUT = flags.DEFINE_string("out", "runs/peers", "results directory (must not hold results yet)")


def main(argv):
  del argv
  xla_env.apply_defaults()
  print(peers.run(_CONFIG.value, _OUT.value))


if __name__ == "__main__":
  app.run(main)
