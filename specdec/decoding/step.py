"""Prefill and the draft -> verify -> accept -> commit step, run in on-device chunks.

The invariant everything here relies on: in the token buffer and in every KV cache, slots at or
past a row's `lengths` are stale. They are masked when read and overwritten when the row grows,
so rejecting drafts never copies or clears anything: rollback is a shorter length.

`step` is one fixed-shape function per `StepConfig` (B, k, S, drafter, sampling, mode): nothing in
it depends on a Python value that changes between steps, and nothing leaves the device inside a
chunk (`decode_chunk` loops on the device until every row is done). Its four phases run under
`jax.named_scope`s of the same names, so a profile attributes each kernel to draft, verify,
accept or commit. See docs/design.md, "The step".

With a `StepConfig.tree` the step verifies a static draft tree instead of a chain
(specdec/decoding/tree.py): the drafter proposes one token per node, the verify feeds the root and
every node under the tree's attention mask, the deepest path the target agrees with is committed,
and its nodes' K/V move from their node slots to their sequence slots.

Shapes (docs/design.md, "Shape letters"): B rows, S slots, T tokens of a forward (the prompt
bucket at prefill, k+1 at verify, the tree's n nodes at a tree verify), J = k draft positions (a
tree's n - 1 drafted nodes), C prefill slice, P positions whose logits are read, D model, V
vocabulary.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec.decoding.accept import Mode, accept, accept_tree
from specdec.decoding.state import DecodeState, counters, ctx_bucket
from specdec.decoding.tree import Tree
from specdec.drafters.base import Context, Drafter, TreeCommit
from specdec.models import stack
from specdec.models.config import ModelConfig
from specdec.models.transformer import ForwardOut, KVCache, Transformer
from specdec.ops import sampling as sampling_lib
from specdec.ops.attention import TreeMask

PREFILL_CHUNK = 2048


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """Everything static about a decode: changing any field compiles a new step."""

  config: ModelConfig
  dtype: object
  drafter: Drafter
  k: int
  sampling: sampling_lib.Sampling
  mode: Mode
  eos_ids: tuple[int, ...]
  kv_dtype: object = None  # None: the model's dtype
  # Longest prompt slice one prefill forward takes. Attention scores of a T-token forward are
  # [B, T, N, S] f32 (8.6 GB a layer for an 8k prompt at 32 heads); longer prompts go through in
  # slices of this many tokens, one compiled forward scanned over them.
  prefill_chunk: int = PREFILL_CHUNK
  # A static draft tree to verify instead of a chain of k drafts (k is then its depth).
  tree: Tree | None = None

  @property
  def module(self) -> Transformer:
    return stack.decoder(self.config, self.dtype)

  @property
  def for_prefill(self) -> "StepConfig":
    """The fields the prefill reads; the others fixed, so k, mode and tree share its executable."""
    return dataclasses.replace(self, k=0, mode="onehot", tree=None)

  @property
  def draft_sampling(self) -> sampling_lib.Sampling:
    # Only full-q acceptance needs drafts drawn from q; every other mode drafts the argmax.
    return self.sampling if self.mode == "fullq" else sampling_lib.Sampling()


def _is_eos(tokens, eos_ids):
  if not eos_ids:
    return jnp.zeros(tokens.shape, bool)
  return jnp.isin(tokens, jnp.asarray(eos_ids, tokens.dtype))


def _prompt_forward(params, prompt_BT, last_BP, cache: KVCache, sc: StepConfig) -> ForwardOut:
  """The target over the whole prompt: logits at last_BP, cache, taps and hidden of every position.

  Prompts longer than sc.prefill_chunk go through in slices (buckets are powers of two, so the
  slice divides them); each slice attends to the cache the earlier ones wrote, which is the causal
  forward over the whole prompt. Each row's tokens past last_BP are padding, which a recurrent
  (hybrid) state must not take in: the forward is told how many are real (`n_commit_B`).
  """
  B, T = prompt_BT.shape
  C = min(T, sc.prefill_chunk)
  n_B = last_BP[:, 0] + 1
  if C == T:
    positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    return sc.module.apply(
      params, prompt_BT, positions_BT, cache, taps=sc.drafter.taps, logits_at_BP=last_BP,
      n_commit_B=n_B,
    )  # fmt: skip

  def chunk(cache, c):
    tokens_BC = jax.lax.dynamic_slice_in_dim(prompt_BT, c * C, C, axis=1)
    positions_BC = jnp.broadcast_to(c * C + jnp.arange(C, dtype=jnp.int32), (B, C))
    out = sc.module.apply(
      params, tokens_BC, positions_BC, cache, taps=sc.drafter.taps,
      logits_at_BP=jnp.zeros((B, 1), jnp.int32),  # logits come from the whole hidden below
      n_commit_B=jnp.clip(n_B - c * C, 0, C),
    )  # fmt: skip
    return out.cache, (out.hidden, out.taps)

  # The scan stacks one [B, C, D] per slice; `whole` lays the T // C slices back along T.
  cache, (hidden, taps) = jax.lax.scan(chunk, cache, jnp.arange(T // C))
  whole = lambda x: jnp.moveaxis(x, 0, 1).reshape(B, T, -1)  # noqa: E731
  hidden_BTD = whole(hidden)
  h_BPD = jnp.take_along_axis(hidden_BTD, last_BP[:, :, None], axis=1)
  logits = sc.module.apply(params, h_BPD, method=Transformer.head)
  return ForwardOut(logits, cache, tuple(whole(t) for t in taps), hidden_BTD)


@functools.partial(jax.jit, static_argnames=("sc", "slots"))
def prefill_fields(
  params, draft_params, prompt_BT, prompt_lengths_B, max_new_B, key, sc, slots
) -> dict:
  """The prompt bucket through the target, the first token sampled, the drafter's state built:
  every field of the decode state but the counters (they alone depend on k)."""
  B, T = prompt_BT.shape
  cache = stack.empty_cache(sc.config, B, slots, sc.kv_dtype or sc.dtype)
  out = _prompt_forward(params, prompt_BT, (prompt_lengths_B - 1)[:, None], cache, sc)
  key, sub = jax.random.split(key)
  first_B = sampling_lib.sample(sub, sampling_lib.probs(out.logits[:, 0], sc.sampling))
  tokens_BS = jnp.zeros((B, slots), jnp.int32).at[:, :T].set(prompt_BT)
  tokens_BS = tokens_BS.at[jnp.arange(B), prompt_lengths_B].set(first_B)
  return dict(
    tokens=tokens_BS,
    lengths=prompt_lengths_B + 1,
    prompt_lengths=prompt_lengths_B,
    max_new=max_new_B,
    cache=out.cache,
    draft=sc.drafter.init(draft_params, prompt_BT, prompt_lengths_B, out),
    key=key,
    done=_is_eos(first_B, sc.eos_ids) | (max_new_B <= 1),
  )


def prefill(
  params, draft_params, prompt_BT, prompt_lengths_B, max_new_B, key, sc: StepConfig, slots,
  reject: bool = False,
) -> DecodeState:  # fmt: skip
  """Runs the prompt bucket through the target, samples the first token, builds the state.

  One executable serves every k and acceptance mode of a (drafter, sampling, bucket, slots): the
  counters, whose shapes follow k, are zeros made on the host. reject=True makes the state's steps
  reject every draft: the same-shape baseline, run by the same step executable as the cell."""
  fields = prefill_fields(
    params, draft_params, prompt_BT, prompt_lengths_B, max_new_B, key, sc.for_prefill, slots
  )
  return with_counters(fields, sc, reject)


def with_counters(fields: dict, sc: StepConfig, reject: bool = False) -> DecodeState:
  """The decode state of `prefill_fields`' output for sc's k: its counters at zero."""
  host = dict(reject=np.asarray(reject), **counters(fields["lengths"].shape[0], sc.k))
  return DecodeState(**fields, **jax.device_put(host))


def emit_counts(n_acc_B, emit_BT, budget_B, done_B, eos_ids: tuple[int, ...]):
  """How many of a verify's T = k+1 output tokens each row emits, and which rows emit an EOS.

  A row that is still running emits its n_acc accepted drafts and the corrected or bonus token
  (n_acc + 1), cut to its remaining budget, then cut again just after the first EOS among the
  tokens it would emit; a row already done emits nothing. emit_BT is `accept`'s output (entries
  after n_acc are ignored), budget_B = max_new - generated. Returns (n_emit_B, eos_B), eos_B
  True where a running row's emitted tokens include an EOS.
  """
  j_T = jnp.arange(emit_BT.shape[1])
  n_emit_B = jnp.minimum(n_acc_B + 1, budget_B)
  eos_BT = _is_eos(emit_BT, eos_ids) & (j_T[None, :] < n_emit_B[:, None])
  hit_eos_B = jnp.any(eos_BT, 1)
  n_emit_B = jnp.where(hit_eos_B, jnp.argmax(eos_BT, 1) + 1, n_emit_B)
  active_B = ~done_B
  return jnp.where(active_B, n_emit_B, 0), active_B & hit_eos_B


def step(params, draft_params, st: DecodeState, sc: StepConfig) -> DecodeState:
  """One draft -> verify -> accept -> commit step over every row (done rows change nothing)."""
  return step_path(params, draft_params, st, sc)[0]


def step_path(params, draft_params, st: DecodeState, sc: StepConfig):
  """`step`, and the accepted path [B, k+1]: its node at each depth, the root first (a chain's
  are 0..k; entries past a row's accepted count meaningless). tree="auto" learns from it."""
  B, S = st.tokens.shape
  k, tree = sc.k, sc.tree
  b_B = jnp.arange(B)
  key, k_draft, k_accept = jax.random.split(st.key, 3)
  ctx = Context(st.tokens, st.lengths)

  with jax.named_scope("draft"):
    if tree is None:
      draft_BJ, q_BJV, draft = sc.drafter.propose(
        draft_params, st.draft, ctx, k, sc.draft_sampling, k_draft
      )
    else:  # one token per drafted node, in node order
      draft_BJ, draft = sc.drafter.propose_tree(
        draft_params, st.draft, ctx, tree, sc.draft_sampling, k_draft
      )

  with jax.named_scope("verify"):
    # One target forward over [newest committed token, d_1 .. d_k] writes their K/V at slots
    # lengths-1 .. lengths+k-1; whatever the accept phase rejects stays stale past `lengths`.
    # A tree's nodes take the slots after the root in node order, at positions root + depth.
    # A hybrid target's recurrent layers return their state after each of the k+1 tokens.
    # A node left unfilled (NO_TOKEN) is fed as token 0; only its own descendants see it.
    root_B = st.lengths - 1
    fed_BJ = draft_BJ if tree is None else jnp.maximum(draft_BJ, 0)
    verify_BT = jnp.concatenate([st.tokens[b_B, root_B][:, None], fed_BJ], 1)
    if tree is None:
      positions_BT = st.lengths[:, None] - 1 + jnp.arange(k + 1, dtype=jnp.int32)
      mask = {}
    else:
      positions_BT = root_B[:, None] + jnp.asarray(tree.depths)[None, :]
      mask = dict(tree=TreeMask(root_B, np.arange(tree.size), tree.ancestors))
    out = sc.module.apply(params, verify_BT, positions_BT, st.cache, taps=sc.drafter.taps, **mask)

  with jax.named_scope("accept"):
    if tree is None:
      n_acc_B, emit_BT = accept(
        k_accept, out.logits, draft_BJ, q_BJV, sc.sampling, sc.mode, reject=st.reject
      )
      path_BT = jnp.broadcast_to(jnp.arange(k + 1, dtype=jnp.int32), (B, k + 1))
    else:
      n_acc_B, emit_BT, path_BT = accept_tree(
        k_accept, out.logits, draft_BJ, tree, sc.sampling, sc.mode, reject=st.reject
      )
    n_emit_B, eos_B = emit_counts(n_acc_B, emit_BT, st.max_new - st.generated, st.done, sc.eos_ids)

  with jax.named_scope("commit"):
    j_T = jnp.arange(k + 1)
    write_BT = jnp.where(j_T[None, :] < n_emit_B[:, None], st.lengths[:, None] + j_T, S)
    tokens = st.tokens.at[b_B[:, None], write_BT].set(emit_BT, mode="drop")
    lengths = st.lengths + n_emit_B
    done = st.done | eos_B | (lengths - st.prompt_lengths >= st.max_new)
    one_B = (~st.done).astype(jnp.int32)
    bucket_B = ctx_bucket(st.lengths)
    cut_B = one_B * (n_emit_B < n_acc_B + 1)  # the budget or an EOS shortened this emission
    hist = st.accept_hist.at[b_B, bucket_B, n_acc_B].add(one_B)
    censored = st.censored_hist.at[b_B, bucket_B, n_acc_B].add(cut_B)
    emitted = st.emitted_by_bucket.at[b_B, bucket_B].add(n_emit_B)
    ctx = Context(tokens, lengths)
    if tree is None:
      cache = out.cache.settle(n_emit_B)  # the state after the emitted tokens (hybrid targets)
      draft = sc.drafter.commit(draft_params, draft, ctx, n_acc_B, out)
    else:
      # The accepted path's node j sits at slot root + path[j]; its sequence slot is root + j.
      dst_BT = jnp.where(j_T[None, :] <= n_acc_B[:, None], root_B[:, None] + j_T, S)
      moved = TreeCommit(path_BT, n_acc_B, root_B[:, None] + path_BT, dst_BT)
      cache = out.cache.move(moved.src_BT, moved.dst_BT)
      draft = sc.drafter.commit_tree(draft_params, draft, ctx, moved, out)
    return st.replace(
      tokens=tokens,
      lengths=lengths,
      cache=cache,
      draft=draft,
      key=key,
      done=done,
      steps=st.steps + one_B,
      proposed=st.proposed + one_B * k,
      accepted=st.accepted + one_B * n_acc_B,
      accept_hist=hist,
      censored_hist=censored,
      emitted_by_bucket=emitted,
    ), path_BT


@functools.partial(jax.jit, static_argnames=("sc", "n_steps"), donate_argnames=("st",))
def decode_chunk(params, draft_params, st: DecodeState, sc: StepConfig, n_steps: int):
  """Up to n_steps steps in one on-device loop that stops once every row is done.

  The stop is decided on the device (a `while_loop` on `done`), so the host looks only between
  chunks, whatever the arm: a chunk never overshoots a budget and never waits on the host per
  step. Rows already done inside a running batch are masked no-ops (see `step`).
  """

  def running(carry):
    i, s = carry
    return (i < n_steps) & ~jnp.all(s.done)

  def one(carry):
    i, s = carry
    return i + 1, step(params, draft_params, s, sc)

  return jax.lax.while_loop(running, one, (jnp.int32(0), st))[1]
