"""The copies in an optimized HLO module: the loop part's census of what a while loop copies every
iteration (its body) against what a call copies once (everywhere else), read from the HLO text.
"""

import math
import re

_SHAPE_RE = re.compile(r"\b(pred|[usf]\d+|bf16|f8e4m3fn)\[([\d,]*)\]")
_ITEMSIZE = {"pred": 1, "bf16": 2, "f8e4m3fn": 1}


def _shape_bytes(shape_text: str) -> int:
  m = _SHAPE_RE.search(shape_text)
  if not m:
    return 0
  ty, dims = m.groups()
  size = _ITEMSIZE.get(ty) or int(ty[1:]) // 8
  return size * math.prod(int(d) for d in dims.split(",") if d)


def hlo_copies(hlo_text: str) -> dict:
  """Top-level copy / copy-start instructions of an optimized HLO module, split by whether they sit
  in a while body (paid every iteration) or elsewhere (paid once per call): count and bytes."""
  bodies = set(re.findall(r"\bbody=%?([\w.\-]+)", hlo_text))
  fused = set(re.findall(r"\bcalls=%?([\w.\-]+)", hlo_text))
  out = {"body": {"n": 0, "bytes": 0}, "elsewhere": {"n": 0, "bytes": 0}}
  comp = None
  for line in hlo_text.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if head:
      comp = head.group(1)
      continue
    m = re.match(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.+?) (copy|copy-start)\(", line)
    if m and comp not in fused:
      where = out["body" if comp in bodies else "elsewhere"]
      where["n"] += 1
      where["bytes"] += _shape_bytes(m.group(1))
  return out
