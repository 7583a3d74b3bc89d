"""The drafter protocol (docs/design.md, "Drafters").

A drafter is a frozen, hashable description (it is a static argument of the jitted step); its
weights travel separately as `params`, passed to every call as an argument, never closed over.

  init(params, prompt_BT, lengths_B, target) -> state         after the target's prefill
  propose(params, state, ctx, k, sampling, key) -> (draft_BJ, q_BJV | None, state)
  commit(params, state, ctx, n_acc_B, target) -> state         after acceptance

Drafters that draft static trees (specdec/decoding/tree.py) also implement
  validate_tree(tree) -> None                                   on the host, before compiling
  propose_tree(params, state, ctx, tree, sampling, key) -> (draft_BJ, state)   J = tree nodes
  commit_tree(params, state, ctx, accepted: TreeCommit, target) -> state
A tree node the drafter has no token for is NO_TOKEN: the verify feeds it as token 0 and the
acceptance never takes it (its descendants, which only it precedes, should be NO_TOKEN too).

`target` is the target's `ForwardOut` of that call (logits, taps at `taps`, final hidden); `ctx`
holds the committed token buffer and lengths. Every shape is static; J = k draft positions.
"""

import dataclasses
from typing import Any, NamedTuple

import jax

NO_TOKEN = -1  # a tree node left unfilled: never accepted


class Context(NamedTuple):
  tokens_BS: jax.Array  # committed tokens; slots >= lengths are stale
  lengths_B: jax.Array  # committed count; tokens_BS[b, lengths_B[b] - 1] is the newest token


class TreeCommit(NamedTuple):
  """What a tree step accepted, and the slot moves it made in the target's cache (a drafter whose
  cache is laid out like the target's makes the same ones)."""

  path_BT: jax.Array  # [B, depth+1] the accepted path's nodes, the root first; valid to n_acc
  n_acc_B: jax.Array  # [B] accepted drafts: the path's depth
  src_BT: jax.Array  # [B, depth+1] slots the path's nodes were verified at: root + node
  dst_BT: jax.Array  # [B, depth+1] their sequence slots root + depth; S (dropped) past n_acc


@dataclasses.dataclass(frozen=True, eq=False)
class Drafter:
  name = "base"
  taps: tuple[int, ...] = ()  # target layers whose hidden states the drafter reads

  @property
  def params(self) -> Any:
    return ()

  def validate(self, target_config, k: int, slots: int) -> None:
    """Raises ValueError naming what does not fit, before anything compiles."""

  def init(self, params, prompt_BT, lengths_B, target):
    return ()

  def propose(self, params, state, ctx: Context, k: int, sampling, key):
    raise NotImplementedError

  def commit(self, params, state, ctx: Context, n_acc_B, target):
    return state

  def validate_tree(self, tree) -> None:
    """Raises ValueError unless this drafter can draft `tree`, before anything compiles."""
    raise ValueError(
      f"drafter {self.name!r} cannot draft trees yet; use ngram, suffix, draft_lm, mtp or eagle3"
    )

  def propose_tree(self, params, state, ctx: Context, tree, sampling, key):
    raise NotImplementedError(f"drafter {self.name!r} cannot draft trees")

  def commit_tree(self, params, state, ctx: Context, accepted: TreeCommit, target):
    raise NotImplementedError(f"drafter {self.name!r} cannot draft trees")
