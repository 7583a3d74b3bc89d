"""The drafter protocol (docs/design.md, "Drafters").

A drafter is a frozen, hashable description (it is a static argument of the jitted step); its
weights travel separately as `params`, passed to every call as an argument, never closed over.

  init(params, prompt_BT, lengths_B, target) -> state         after the target's prefill
  propose(params, state, ctx, k, sampling, key) -> (draft_BJ, q_BJV | None, state)
  commit(params, state, ctx, n_acc_B, target) -> state         after acceptance

`target` is the target's `ForwardOut` of that call (logits, taps at `taps`, final hidden); `ctx`
holds the committed token buffer and lengths. Every shape is static; J = k draft positions.
"""

import dataclasses
from typing import Any, NamedTuple

import jax


class Context(NamedTuple):
  tokens_BS: jax.Array  # committed tokens; slots >= lengths are stale
  lengths_B: jax.Array  # committed count; tokens_BS[b, lengths_B[b] - 1] is the newest token


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
