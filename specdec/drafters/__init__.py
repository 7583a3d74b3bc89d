"""Drafters, one file each; all follow the protocol in `base.py`.

`ngram(...)`, `suffix(...)`, `draft_lm(model)` and `null()` build drafters, and `oracle(rows,
vocab, miss)` one that knows the answer (acceptance under control, for benchmarks and tests);
learned drafters are loaded from their published layouts with `load_block`, `load_mtp`,
`load_eagle3` (their modules, e.g. `specdec.drafters.mtp`, also build fresh ones for training).
"""

from specdec.drafters.base import Context, Drafter
from specdec.drafters.block_io import load_block, save_block
from specdec.drafters.draft_lm import draft_lm
from specdec.drafters.eagle3 import load_eagle3, save_eagle3
from specdec.drafters.mtp import load_mtp, save_mtp
from specdec.drafters.ngram import ngram
from specdec.drafters.null import null
from specdec.drafters.oracle import oracle
from specdec.drafters.suffix import suffix

__all__ = [
  "Context",
  "Drafter",
  "draft_lm",
  "load_block",
  "load_eagle3",
  "load_mtp",
  "ngram",
  "null",
  "oracle",
  "save_block",
  "save_eagle3",
  "save_mtp",
  "suffix",
]
