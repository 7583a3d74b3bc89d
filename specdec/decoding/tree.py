"""Static draft trees: the node layout a tree verify feeds, parsed from a list of paths.

PATHS follow vLLM's `speculative_token_tree` / EAGLE's `choices` convention: each path is a tuple
of child ranks from the root, (0,) the root's best child, (0, 1) that child's second-best child.
The root (node 0) is the newest committed token and is not listed. Nodes are laid out
breadth-first, by (depth, path): node i's K/V goes to slot root + i during a verify, its RoPE
position is root + depth(i), and it attends to the committed prefix and to its ancestors.

Shapes: n tree nodes with the root (the verify's T), J = n - 1 drafted nodes, o child ranks.
"""

import dataclasses
import functools

import numpy as np

# Widest tree a step verifies: n nodes mean [B, n, N, S] attention scores per layer, and
# published trees (EAGLE's default, SGLang's topk trees) stay well under this.
MAX_NODES = 128


@dataclasses.dataclass(frozen=True)
class Tree:
  """A validated tree, hashable (a static field of the step's config). Build with `tree(paths)`."""

  paths: tuple[tuple[int, ...], ...]  # the drafted nodes 1..J in node order

  @property
  def size(self) -> int:
    """n: the nodes one verify feeds, the root included."""
    return len(self.paths) + 1

  @property
  def depth(self) -> int:
    """The longest root-to-leaf path: the most drafts one step can accept."""
    return max(len(p) for p in self.paths)

  @functools.cached_property
  def _index(self) -> dict:
    return {(): 0} | {p: i + 1 for i, p in enumerate(self.paths)}

  @functools.cached_property
  def parents(self) -> np.ndarray:
    """[n] int32: each node's parent, the root its own."""
    return np.asarray([0] + [self._index[p[:-1]] for p in self.paths], np.int32)

  @functools.cached_property
  def depths(self) -> np.ndarray:
    """[n] int32: 0 for the root."""
    return np.asarray([0] + [len(p) for p in self.paths], np.int32)

  @functools.cached_property
  def ancestors(self) -> np.ndarray:
    """[n, n] bool: [i, j] where node j is node i or one of its ancestors (the attention mask)."""
    a_nn = np.eye(self.size, dtype=bool)
    for i, p in enumerate(self.paths, 1):
      for d in range(len(p)):
        a_nn[i, self._index[p[:d]]] = True
    return a_nn

  @functools.cached_property
  def path_to(self) -> np.ndarray:
    """[n, depth+1] int32: [i, d] is node i's ancestor at depth d, node i itself past its depth
    (so the accepted path to i is path_to[i, :depth(i)+1])."""
    out = np.zeros((self.size, self.depth + 1), np.int32)
    for i in range(self.size):
      p = self.paths[i - 1] if i else ()
      out[i] = [self._index[p[: min(d, len(p))]] for d in range(self.depth + 1)]
    return out

  @functools.cached_property
  def children(self) -> np.ndarray:
    """[n, o] int32: [i, r] is node i's child of rank r, -1 where it has fewer than o children."""
    width = max(p[-1] for p in self.paths) + 1
    out = np.full((self.size, width), -1, np.int32)
    for i, p in enumerate(self.paths, 1):
      out[self._index[p[:-1]], p[-1]] = i
    return out

  def at_depth(self, d: int) -> np.ndarray:
    """The nodes of depth d, in node order."""
    return np.flatnonzero(self.depths == d).astype(np.int32)


def tree(paths, max_nodes: int = MAX_NODES) -> Tree:
  """Validates PATHS and lays the nodes out breadth-first. Raises ValueError naming the bad path:
  an empty path, a negative or non-integer rank, a duplicate, a missing parent, a rank whose
  smaller siblings are absent (child r is the r-th best candidate, so ranks 0..r-1 must exist),
  or more than max_nodes nodes besides the root."""
  if isinstance(paths, Tree):
    paths = paths.paths
  if not paths:
    raise ValueError("tree: PATHS is empty; give at least one path such as [(0,)]")
  seen = set()
  for p in paths:
    if isinstance(p, int | str) or not all(isinstance(r, int) for r in p):
      raise ValueError(f"tree: path {p!r} is not a tuple of integer child ranks")
    p = tuple(p)
    if not p:
      raise ValueError("tree: an empty path () is the root, which is not listed")
    if min(p) < 0:
      raise ValueError(f"tree: path {p} has a negative child rank")
    if p in seen:
      raise ValueError(f"tree: path {p} is listed twice")
    seen.add(p)
  for p in seen:
    if len(p) > 1 and p[:-1] not in seen:
      raise ValueError(f"tree: path {p} has no parent {p[:-1]} in PATHS")
    if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in seen:
      raise ValueError(f"tree: path {p} has no sibling {p[:-1] + (p[-1] - 1,)} of the rank before")
  if len(seen) > max_nodes:
    raise ValueError(f"tree: {len(seen)} nodes exceed the verify width limit of {max_nodes}")
  return Tree(tuple(sorted(seen, key=lambda p: (len(p), p))))


def binary_paths(n: int) -> list[tuple[int, ...]]:
  """PATHS of the first n nodes (root included) of the breadth-first binary tree: (0,), (1,),
  (0, 0), (0, 1), ... The tree of N nodes that a verify of width N compares against a chain."""
  paths, frontier = [], [()]
  while len(paths) < n - 1:
    frontier = [p + (r,) for p in frontier for r in (0, 1)]
    paths += frontier[: n - 1 - len(paths)]
  return paths
