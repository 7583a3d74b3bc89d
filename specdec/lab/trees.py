"""Static draft trees as values of the sweep's `trees` axis: named presets and explicit PATHS.

A spec is a preset's name or a tuple of PATHS (specdec/decoding/tree.py: vLLM's
`speculative_token_tree` convention, (0,) the root's best child, (0, 1) that child's second-best).
A cell names its tree by a label, the cell key's `tree` field: the preset's name, or the paths as
compact JSON ("[[0],[1],[0,0]]"), so a label reads back as the same tree (`resolve`). Presets are
small, to fit a CPU sweep, and each matches a chain's verify width (nodes verified per step, the
root included; k + 1 for a chain of k):

  wide3    (0,) (1,) (2,)                          depth 1, width 4 (chain k = 3): 3 candidates
  binary2  (0,) (1,) (0,0) (0,1) (1,0) (1,1)       depth 2, width 7 (chain k = 6): full binary
  skewed3  (0,) (1,) (2,) (0,0) (0,1) (0,0,0)      depth 3, width 7 (chain k = 6): EAGLE-like,
                                                   wide at the root, deeper under the best child
"""

import json

from specdec.decoding.tree import Tree, tree

PRESETS: dict[str, tuple[tuple[int, ...], ...]] = {
  "wide3": ((0,), (1,), (2,)),
  "binary2": ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)),
  "skewed3": ((0,), (1,), (2,), (0, 0), (0, 1), (0, 0, 0)),
}
SPEC_HELP = (
  f"a tree is a preset ({', '.join(PRESETS)}) or a tuple of paths of child ranks such as "
  "((0,), (1,), (0, 0))"
)


def resolve(spec) -> tuple[str, Tree]:
  """(label, tree) of a spec or a label; ValueError naming what is wrong with it. Explicit paths
  equal to a preset's take the preset's name."""
  if isinstance(spec, str):
    if spec in PRESETS:
      return spec, tree(PRESETS[spec])
    try:
      paths = json.loads(spec)
    except json.JSONDecodeError:
      raise ValueError(f"unknown tree {spec!r}; {SPEC_HELP}") from None
  else:
    paths = spec
  if not isinstance(paths, list | tuple) or not paths:
    raise ValueError(f"{spec!r} is not a tree; {SPEC_HELP}")
  t = tree([tuple(p) if isinstance(p, list) else p for p in paths])
  for name, preset in PRESETS.items():
    if tree(preset) == t:
      return name, t
  return json.dumps([list(p) for p in t.paths], separators=(",", ":")), t
