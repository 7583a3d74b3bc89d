"""Shared pieces of the learned heads that draft from the target's hidden states (MTP, EAGLE-3).

Both heads pair the target's feature at position i with the token at i+1 and predict the token at
i+2 through one decoder layer with its own KV cache; deeper drafts feed the head its own output in
place of the target's feature. Pair i lives in cache slot i (vLLM's convention), so rollback is by
length, as for the target, and a draft at depth j sits at RoPE position i + j: EAGLE-3's own trainer
rotates its test-time-training step j at the position plus j as well (SafeAILab/EAGLE,
eagle/traineagle3/cnets.py), so published EAGLE-3 heads expect this. With L committed tokens the
target has features for positions < L-1, so the head's cache holds true pairs < L-2, and pair L-2
(the last target feature with the newest token) drafts d_1.

commit re-runs the head over the k+1 verify positions with the TRUE target features (fixed width;
pairs past the accepted prefix are stale, masked by length and overwritten later) and keeps the
head's output at pair L-2, so a step costs k head forwards: one of width k+1 in commit and k-1 of
width 1 in propose. Only the first proposal after the prefill runs pair L-2 itself, because the
first token is sampled after `init` has run.

Trees (specdec/decoding/tree.py): the root's children are the top tokens of the output at pair L-2;
depth d then runs the head once over its nodes that have children, each node pairing its parent's
output with its own token at position root + d - 1 (where the chain's d-th draft sits), attending
to the committed pairs and its ancestors; its children are its top tokens by rank. Node i's K/V
goes to slot root + i - 1, so a depth-1 node sits in the chain's d_1 slot. commit_tree is the chain
commit over the accepted path: the target's features at the path's nodes are those of the
sequence positions the path now fills, so the head ends as the chain leaves it.

The checkpoint helpers below read and write a head's tensors by their published names, with the
same all-or-nothing checks as the target loader.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from specdec.checkpoint.safetensors_io import (
  CheckpointError,
  checkpoint_files,
  read_tensors,
  write_tensors,
)
from specdec.drafters.base import Drafter
from specdec.models.config import ModelConfig
from specdec.models.transformer import KVCache
from specdec.ops import sampling as sampling_lib
from specdec.ops.attention import TreeMask

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def weights_field():
  """A head's weights stay out of its equality and hash: its methods read weights only through
  the `params` argument, so heads of one configuration (trained or not, loaded or not) share
  compiled steps."""
  return dataclasses.field(default=None, compare=False)


@flax.struct.dataclass
class HeadState:
  cache: KVCache  # the head's own KV cache, valid for pairs < L-2
  h_BD: jax.Array  # fresh: the target feature of pair L-2; else the head's output at pair L-2
  fresh: jax.Array  # bool []: True from init until the first proposal


def pick(key, logits_BV, sampling):
  """Argmax, or a draw from q under non-greedy (full-q) sampling; returns (token_B, q_BV)."""
  q_BV = sampling_lib.probs(logits_BV, sampling)
  if sampling.greedy:
    return jnp.argmax(logits_BV, -1).astype(jnp.int32), q_BV
  return sampling_lib.sample(key, q_BV), q_BV


def gather_B(x_BT, idx_B):
  """x[b, idx[b]] for x [B, T, ...]."""
  idx = idx_B.reshape(idx_B.shape + (1,) * (x_BT.ndim - 1))
  return jnp.take_along_axis(x_BT, idx, 1)[:, 0]


@dataclasses.dataclass(frozen=True, eq=False)
class ChainedHead(Drafter):
  """A head that drafts by chaining its own output; subclasses define the three methods below."""

  head_config: ModelConfig | None = None  # its decoder layer (the cache is shaped from it)
  dtype: Any = jnp.bfloat16

  def features(self, params, target) -> jax.Array:
    """The target's ForwardOut -> the feature [B, T, D] each pair consumes."""
    raise NotImplementedError

  def forward(self, params, h_BTD, tokens_BT, positions_BT, cache, tree=None):
    """Pairs (h, token) at positions -> (the head's output [B, T, D], cache); tree: a
    `TreeMask` placing the pairs' K/V and masking their attention."""
    raise NotImplementedError

  def logits(self, params, out_BD) -> jax.Array:
    """The head's output -> float32 logits over the TARGET vocabulary."""
    raise NotImplementedError

  def teacher_forced(self, params, h_BTD, tokens_BT, slots=None):
    """Every pair of a sequence from position 0: pair p is (feature p, token p+1), so the output
    at p predicts token p+2 (the last pair gets a padding token). Returns (out_BTD, cache)."""
    B, T = tokens_BT.shape
    cache = KVCache.zeros(self.head_config.replace(num_layers=1), B, slots or T, self.dtype)
    next_BT = jnp.concatenate([tokens_BT[:, 1:], jnp.zeros((B, 1), tokens_BT.dtype)], 1)
    positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    return self.forward(params, h_BTD, next_BT, positions_BT, cache)

  def chained(self, params, out_BTD, cache, tokens_BT, origins_BO, depth):
    """Drafting replayed from many origins at once on the TRUE tokens (training-time test):
    origin o starts from the head's output at pair o, and depth s feeds pair o+s (the previous
    depth's output, token o+s+1) at position o+s, seeing the true pairs <= o and its own chain,
    exactly as `propose` does. Each origin writes into a private copy of the teacher-forced cache.
    Returns the outputs of depths 1..depth-1, each [B, O, D]; depth s predicts token o+s+2."""
    B, T = tokens_BT.shape
    O = origins_BO.shape[1]
    b_BO = jnp.broadcast_to(jnp.arange(B)[:, None], (B, O))
    # [B * O, 1, D]: every (row, origin) pair is one row of the head's batch.
    h = out_BTD[b_BO, origins_BO].reshape(B * O, 1, -1)
    cache = jax.tree.map(lambda x: jnp.repeat(x, O, axis=0), cache)
    outs = []
    for s in range(1, depth):
      pos_BO = origins_BO + s
      tok_BO = tokens_BT[b_BO, jnp.minimum(pos_BO + 1, T - 1)]
      h, cache = self.forward(params, h, tok_BO.reshape(B * O, 1), pos_BO.reshape(B * O, 1), cache)
      outs.append(h.reshape(B, O, -1))
    return outs

  def init(self, params, prompt_BT, lengths_B, target):
    h_BTD = self.features(params, target).astype(self.dtype)
    # Pairs >= lengths-1 hold padding; each is overwritten before anything attends to it.
    _, cache = self.teacher_forced(params, h_BTD, prompt_BT, target.cache.slots)
    return HeadState(cache=cache, h_BD=gather_B(h_BTD, lengths_B - 1), fresh=jnp.array(True))

  def _root_output(self, params, state: HeadState, ctx):
    """The head's output at pair L-2 (which drafts d_1) and the cache holding pairs <= L-2."""
    lengths_B = ctx.lengths_B
    newest_B = jnp.take_along_axis(ctx.tokens_BS, (lengths_B - 1)[:, None], 1)[:, 0]

    def run_first_pair(state):
      out_B1D, cache = self.forward(
        params, state.h_BD[:, None], newest_B[:, None], (lengths_B - 2)[:, None], state.cache
      )
      return out_B1D[:, 0].astype(self.dtype), cache

    return jax.lax.cond(state.fresh, run_first_pair, lambda s: (s.h_BD, s.cache), state)

  def propose(self, params, state: HeadState, ctx, k, sampling, key):
    lengths_B = ctx.lengths_B
    out_BD, cache = self._root_output(params, state, ctx)
    keys = jax.random.split(key, k)
    d_B, q_BV = pick(keys[0], self.logits(params, out_BD), sampling)

    def one(carry, key_i):
      cache, out_BD, d_B, pos_B = carry
      o_B1D, cache = self.forward(params, out_BD[:, None], d_B[:, None], pos_B[:, None], cache)
      nd_B, nq_BV = pick(key_i, self.logits(params, o_B1D[:, 0]), sampling)
      return (cache, o_B1D[:, 0], nd_B, pos_B + 1), (nd_B, nq_BV)

    carry = (cache, out_BD, d_B, lengths_B - 1)
    (cache, _, _, _), (rest_JB, rest_JBV) = jax.lax.scan(one, carry, keys[1:])
    draft_BJ = jnp.concatenate([d_B[:, None], rest_JB.T], 1)
    q_BJV = jnp.concatenate([q_BV[:, None], jnp.swapaxes(rest_JBV, 0, 1)], 1)
    return draft_BJ, q_BJV, state.replace(cache=cache, fresh=jnp.array(False))

  def commit(self, params, state: HeadState, ctx, n_acc_B, target):
    return self._commit(params, state, ctx, n_acc_B, self.features(params, target))

  def _commit(self, params, state: HeadState, ctx, n_acc_B, h_BTD):
    """Re-runs the pairs from the previous root on the true features h_BTD (T = depth + 1, the
    first at the previous root's position) and keeps the output at the new pair L-2."""
    tokens_BS, lengths_B = ctx.tokens_BS, ctx.lengths_B
    S = tokens_BS.shape[1]
    T = h_BTD.shape[1]
    # Rows still running emitted n_acc + 1 tokens; finished rows compute harmless garbage.
    old_B = lengths_B - n_acc_B - 1
    positions_BT = jnp.maximum(old_B[:, None] - 1 + jnp.arange(T, dtype=jnp.int32), 0)
    next_BT = jnp.take_along_axis(tokens_BS, jnp.minimum(positions_BT + 1, S - 1), 1)
    out_BTD, cache = self.forward(params, h_BTD, next_BT, positions_BT, state.cache)
    out_BD = gather_B(out_BTD, n_acc_B).astype(self.dtype)
    return HeadState(cache=cache, h_BD=out_BD, fresh=jnp.array(False))

  @property
  def draft_vocab_size(self) -> int:
    """How many distinct tokens the head can draft (a node's children at most)."""
    return self.head_config.vocab_size

  def validate_tree(self, tree):
    width, V = tree.children.shape[1], self.draft_vocab_size
    if width > V:
      raise ValueError(
        f"{self.name}: a node with {width} children exceeds the {V} draftable tokens"
      )

  def propose_tree(self, params, state: HeadState, ctx, tree, sampling, key):
    del sampling, key  # children are the head's top tokens, whatever the target samples
    out_BD, cache = self._root_output(params, state, ctx)
    root_B = ctx.lengths_B - 1
    B = root_B.shape[0]
    tok_Bn = jnp.zeros((B, tree.size), jnp.int32)
    out_BnD = jnp.zeros((B, tree.size, out_BD.shape[-1]), self.dtype).at[:, 0].set(out_BD)
    width = tree.children.shape[1]
    for d in range(tree.depth):
      q_m = tree.at_depth(d)
      q_m = q_m[tree.children[q_m, 0] >= 0]  # nodes of depth d with children
      if d:
        # Pair slots start at the root's: node i at root + i - 1, the root column dropped.
        mask = TreeMask(root_B, q_m - 1, tree.ancestors[q_m][:, 1:])
        pos_Bm = jnp.broadcast_to(root_B[:, None] + d - 1, (B, len(q_m)))
        h_BmD = out_BnD[:, tree.parents[q_m]]
        o_BmD, cache = self.forward(params, h_BmD, tok_Bn[:, q_m], pos_Bm, cache, tree=mask)
        out_BnD = out_BnD.at[:, q_m].set(o_BmD.astype(self.dtype))
      top_Bmo = jax.lax.top_k(self.logits(params, out_BnD[:, q_m]), width)[1].astype(jnp.int32)
      for r in range(width):
        child_m = tree.children[q_m, r]
        has = child_m >= 0
        tok_Bn = tok_Bn.at[:, child_m[has]].set(top_Bmo[:, has, r])
    return tok_Bn[:, 1:], state.replace(cache=cache, fresh=jnp.array(False))

  def commit_tree(self, params, state: HeadState, ctx, accepted, target):
    # The verify's features in node order; the accepted path's are those of its sequence slots.
    h_BnD = self.features(params, target)
    h_BTD = jnp.take_along_axis(h_BnD, accepted.path_BT[:, :, None], 1)
    return self._commit(params, state, ctx, accepted.n_acc_B, h_BTD)


# --- Published checkpoint layouts ------------------------------------------------------------


def hf_style_name(path: str) -> tuple[str, bool]:
  """params path of a module named like its HF counterpart -> (HF name, transpose):
  a Linear 'a/b/kernel' is 'a.b.weight' stored (out, in); a norm 'a/scale' is 'a.weight'."""
  *module, leaf = path.split("/")
  name = ".".join(module)
  if leaf == "kernel":
    return name + ".weight", True
  if leaf == "scale":
    return name + ".weight", False
  if leaf == "bias":
    return name + ".bias", False
  raise KeyError(f"params path {path!r} has no HF-style name")


def param_shapes(module, *args, method=None) -> dict[str, tuple[int, ...]]:
  """'a/b/kernel' -> shape of a module's params, from its init traced abstractly."""
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), *args, method=method)["params"])
  return {"/".join(k): v.shape for k, v in flatten_dict(shapes).items()}


def read_head(
  path: str,
  names: dict[str, tuple[str, bool]],
  shapes: dict[str, tuple[int, ...]],
  owned: Callable[[str], bool],
  extras: tuple[str, ...] = (),
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """Reads a head's tensors from a safetensors checkpoint directory, all or nothing.

  names: params path -> (tensor name, transpose); shapes: params path -> our (in, out) shape.
  owned(name): whether a tensor belongs to this head (a head may share the target's files);
  an owned tensor that is neither expected nor in `extras` is an error.
  Returns ({params path: float32 array}, {extra name: array}); every error names the tensor.
  """
  files = checkpoint_files(path)
  expected = {hf: p for p, (hf, _) in names.items()}
  for name in sorted(files):
    if owned(name) and name not in expected and name not in extras:
      raise CheckpointError(f"{files[name]}: unexpected tensor {name!r} for this head")
  flat = {}
  for p, (hf, transpose) in names.items():
    if hf not in files:
      raise CheckpointError(f"{path}: missing tensor {hf!r}")
    array = read_tensors(files[hf], [hf])[hf]
    if array.dtype.name not in FLOAT_DTYPES:
      raise CheckpointError(
        f"{files[hf]}: tensor {hf!r} has dtype {array.dtype.name}; expected a float dtype"
      )
    want = shapes[p][::-1] if transpose else shapes[p]
    if array.shape != want:
      raise CheckpointError(
        f"{files[hf]}: tensor {hf!r} has shape {array.shape}, expected {want} from config.json"
      )
    flat[p] = (array.T if transpose else array).astype(np.float32)
  found = {n: read_tensors(files[n], [n])[n] for n in extras if n in files}
  return flat, found


def write_head(
  file: str, flat: dict[str, Any], names: dict[str, tuple[str, bool]], extras=None, dtype=None
) -> None:
  """The inverse of `read_head` for one file: {params path: array} -> named tensors."""
  tensors = {}
  for p, value in flat.items():
    hf, transpose = names[p]
    a = np.asarray(jnp.asarray(value, dtype or value.dtype))
    tensors[hf] = np.ascontiguousarray(a.T if transpose else a)
  tensors.update(extras or {})
  write_tensors(file, tensors, {"format": "pt"})


def as_params(flat: dict[str, np.ndarray], dtype) -> dict:
  return {
    "params": unflatten_dict({tuple(p.split("/")): jnp.asarray(v, dtype) for p, v in flat.items()})
  }


def flat_params(params) -> dict[str, Any]:
  return {"/".join(k): v for k, v in flatten_dict(params["params"]).items()}
