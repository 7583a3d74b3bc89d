"""A checkpoint directory's identity, so a sweep never resumes against different weights.

The sweep's config names checkpoints by path (`zoo:target`); retraining the zoo, or replacing a
directory, keeps the path. The fingerprint hashes every file's name, size and bytes (for files over
FULL_BYTES, their first and last EDGE_BYTES: new weights change both ends of a shard, and a 16 GB
checkpoint is not read twice to start a sweep).
"""

import hashlib
import os

FULL_BYTES = 256 * 2**20
EDGE_BYTES = 16 * 2**20
_CHUNK = 2**20


def _update(h, f, n: int) -> None:
  while n > 0:
    block = f.read(min(_CHUNK, n))
    if not block:
      return
    h.update(block)
    n -= len(block)


def fingerprint(path: str) -> str:
  """16 hex digits of sha256 over the directory's files (sorted by name, subdirectories skipped)."""
  h = hashlib.sha256()
  for name in sorted(os.listdir(path)):
    file = os.path.join(path, name)
    if not os.path.isfile(file):
      continue
    size = os.path.getsize(file)
    h.update(f"{name}\0{size}\0".encode())
    with open(file, "rb") as f:
      if size <= FULL_BYTES:
        _update(h, f, size)
      else:
        _update(h, f, EDGE_BYTES)
        f.seek(size - EDGE_BYTES)
        _update(h, f, EDGE_BYTES)
  return h.hexdigest()[:16]
