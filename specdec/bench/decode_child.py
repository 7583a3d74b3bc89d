"""Cells that need a process of their own, and the messages between parent and child.

A fresh Python process runs one cell under its own XLA_FLAGS (XLA reads them once, at backend
start), its own SPECDEC_ATTENTION and its own compilation caches. The parent starts
`python -m specdec.bench.decode_child SPEC`, SPEC being JSON {"kind": ..., "kwargs": {...}}; the
child runs CHILDREN[kind](**kwargs) and prints one line, RESULT_TAG + the result as JSON. Anything
else it prints is ignored; a non-zero exit or no result line raises in the parent, with the
child's stderr. The child is an entry point: it applies specdec's default XLA flags
(`xla_env.apply_defaults`) to the arm's, as each row's `xla_flags` records.
"""

import json
import math
import os
import subprocess
import sys

from specdec import xla_env
from specdec.bench.decode_cells import compile_time, decode_child, loop_overhead

RESULT_TAG = "BENCH_DECODE_RESULT "
CHILDREN = {"loop": loop_overhead, "compile": compile_time, "flags": decode_child}


def run_child(
  kind: str, kwargs: dict, xla_flags: str | None = None, timeout=None, attention: str | None = None
) -> dict:
  """Runs CHILDREN[kind](**kwargs) in a fresh Python process (its own XLA flags and caches);
  attention "xla" sets SPECDEC_ATTENTION=xla there, "auto" clears it (None: inherited)."""
  env = dict(os.environ)
  if xla_flags is not None:
    env["XLA_FLAGS"] = xla_flags
  if attention is not None:
    env["SPECDEC_ATTENTION"] = "xla" if attention == "xla" else ""
  spec = json.dumps({"kind": kind, "kwargs": kwargs})
  p = subprocess.run(
    [sys.executable, "-m", "specdec.bench.decode_child", spec],
    env=env,
    capture_output=True,
    text=True,
    timeout=None if timeout is None or math.isinf(timeout) else timeout,
  )
  lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT_TAG)]
  if p.returncode or not lines:
    raise RuntimeError(f"{kind} subprocess exited {p.returncode}: {p.stderr[-2000:]}")
  return json.loads(lines[-1][len(RESULT_TAG) :])


def _child_main(spec_json: str) -> None:
  spec = json.loads(spec_json)
  result = CHILDREN[spec["kind"]](**spec["kwargs"])
  print(RESULT_TAG + json.dumps(result), flush=True)


if __name__ == "__main__":
  xla_env.apply_defaults()
  _child_main(sys.argv[1])
