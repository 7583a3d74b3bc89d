"""HF transformers against specdec on one machine: same weights, same prompts, interleaved legs.

  python -m experiments.bench_peers [--config=configs/bench_peers.py] [--config.parts=zoo] \
      [--config.torch_python=.venv-ref/bin/python] --out=runs/peers

Prints a Markdown table per part (both rate conventions, spread between legs, the greedy gate,
token agreement with specdec's greedy decode) and writes OUT/results.jsonl and OUT/peers.md.
transformers runs in a worker process (specdec/peers_torch.py); see specdec/peers.py.
"""

from absl import app, flags
from ml_collections import config_flags

from specdec import peers

_CONFIG = config_flags.DEFINE_config_file("config", "configs/bench_peers.py", "peer bench config")
_OUT = flags.DEFINE_string("out", "runs/peers", "results directory (must not hold results yet)")


def main(argv):
  del argv
  print(peers.run(_CONFIG.value, _OUT.value))


if __name__ == "__main__":
  app.run(main)
