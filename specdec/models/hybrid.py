"""The hybrid decoder stack (Qwen3-Next: Gated DeltaNet and gated attention layers, dense or
routed-expert MLPs; Qwen3-MoE: attention with routed experts) and its decode state.

Attention layers keep the static KV cache (rollback is a shorter length). A linear-attention
layer's state cannot be rolled back that way, so a verify forward (no `n_commit_B`) returns a
pending cache holding that layer's state after every one of its T tokens, and the step's commit
keeps the one at the emitted count: `HybridCache.settle` is slot selection, with no second
forward and no copy of the states it does not keep.
"""

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from specdec.models.config import HybridConfig
from specdec.models.gated_deltanet import GatedDeltaNet
from specdec.models.hybrid_layers import GatedAttention, MoEBlock, rms_norm
from specdec.models.transformer import MLP, ForwardOut, KVCache, Linear, Transformer, apply_layer
from specdec.ops import gdn
from specdec.ops.kv_cache import FP8, check_kv_dtype


@flax.struct.dataclass
class HybridCache:
  """kv: the attention layers' caches, in layer order. Per linear-attention layer: conv
  [B, Z - 1, X] (the compute dtype) and rec [B, Y, H, U] (float32); pending (after a verify
  forward of T tokens): conv [B, T + Z - 1, X] and rec [B, T + 1, Y, H, U], index n the state
  after the first n tokens."""

  kv: KVCache
  conv: tuple[jax.Array, ...]
  rec: tuple[jax.Array, ...]
  pending: bool = flax.struct.field(pytree_node=False, default=False)

  @staticmethod
  def zeros(c: HybridConfig, batch: int, slots: int, dtype=jnp.bfloat16) -> "HybridCache":
    if check_kv_dtype(dtype) == FP8:
      raise ValueError(f"{c.model_type}: an FP8 KV cache is not supported for hybrid targets")
    kv = KVCache.zeros(c.replace(num_layers=len(c.attention_layers)), batch, slots, dtype)
    n = len(c.linear_layers)
    Y, H, U = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    conv = jnp.zeros((batch, c.linear_conv_kernel - 1, c.conv_dim), dtype)
    rec = jnp.zeros((batch, Y, H, U), jnp.float32)
    return HybridCache(kv=kv, conv=(conv,) * n, rec=(rec,) * n)

  @property
  def slots(self) -> int:
    return self.kv.slots

  def settle(self, n_B) -> "HybridCache":
    """The state after the first n_B[b] tokens of the forward that made this pending cache."""
    if not self.pending:
      return self
    taps = [w.shape[1] - r.shape[1] + 2 for w, r in zip(self.conv, self.rec, strict=True)]
    pick = lambda r: jnp.take_along_axis(r, n_B[:, None, None, None, None], 1)[:, 0]  # noqa: E731
    return HybridCache(
      kv=self.kv,
      conv=tuple(gdn.conv_state_at(w, n_B, z) for w, z in zip(self.conv, taps, strict=True)),
      rec=tuple(pick(r) for r in self.rec),
    )


class HybridBlock(nn.Module):
  config: HybridConfig
  layer: int

  @nn.compact
  def __call__(self, x_BTD, positions_BT, state: tuple, n_commit_B, from_zero=False):
    """state: (k, v) of an attention layer or (conv, rec) of a linear one, returned updated."""
    c = self.config
    h_BTD = rms_norm(c, "attn_norm")(x_BTD)
    if c.layer_types[self.layer] == "linear_attention":
      a_BTD, *state = GatedDeltaNet(c, name="linear_attn")(h_BTD, *state, n_commit_B)
    else:
      a_BTD, *state = GatedAttention(c, name="attn")(h_BTD, positions_BT, *state, from_zero)
    x_BTD = x_BTD + a_BTD
    mlp = MoEBlock(c, name="mlp") if c.moe_layers[self.layer] else MLP(c, name="mlp")
    x_BTD = x_BTD + mlp(rms_norm(c, "mlp_norm")(x_BTD))
    return x_BTD, tuple(state)


def first_of_kind(c: HybridConfig, layer: int) -> int:
  """The first layer with `layer`'s mixer and MLP: a HybridBlock reads its index for these alone."""
  kind = (c.layer_types[layer], c.moe_layers[layer])
  return next(i for i in range(c.num_layers) if (c.layer_types[i], c.moe_layers[i]) == kind)


class HybridTransformer(Transformer):
  """Transformer's embedding, head and call contract over HybridBlocks and a HybridCache."""

  config: HybridConfig

  def setup(self):
    c = self.config
    self.embed = nn.Embed(c.vocab_size, c.hidden_size, param_dtype=self.dtype, name="embed")
    self.blocks = [HybridBlock(c, i, name=f"layer_{i}") for i in range(c.num_layers)]
    self.final_norm = rms_norm(c, "final_norm")
    if not c.tie_word_embeddings:
      self.lm_head = Linear(c.vocab_size, name="lm_head")

  def __call__(
    self,
    tokens_BT,
    positions_BT,
    cache: HybridCache,
    taps: tuple[int, ...] = (),
    logits_at_BP=None,
    inputs_BTD=None,
    n_commit_B=None,
    from_zero: bool = False,
  ) -> ForwardOut:
    """As `Transformer.__call__`; n_commit_B (tokens of each row that are real, the rest
    padding) gives a settled cache, None a pending one (module docstring)."""
    c = self.config
    x_BTD = self.embed_tokens(tokens_BT) if inputs_BTD is None else inputs_BTD.astype(self.dtype)
    ks, vs, convs, recs, tapped = [], [], [], [], {}
    lin, att = iter(range(len(c.linear_layers))), iter(range(len(c.attention_layers)))
    for i, block in enumerate(self.blocks):
      linear = c.layer_types[i] == "linear_attention"
      j = next(lin) if linear else next(att)
      state = (cache.conv[j], cache.rec[j]) if linear else (cache.kv.k[j], cache.kv.v[j])
      if self.is_initializing():
        x_BTD, (a, b) = block(x_BTD, positions_BT, state, n_commit_B, from_zero)
      else:
        # As the first layer of its kind: the layers of a kind share a trace and a lowering.
        x_BTD, (a, b) = apply_layer(
          block.variables, (x_BTD, positions_BT, state, n_commit_B),
          layer=HybridBlock(c, first_of_kind(c, i), parent=None), static=(from_zero,),
        )  # fmt: skip
      for out, x in zip((convs, recs) if linear else (ks, vs), (a, b), strict=True):
        out.append(x)
      tapped[i] = x_BTD
    logits, h_BTD = self.read_out(x_BTD, logits_at_BP)
    new = HybridCache(KVCache(tuple(ks), tuple(vs)), tuple(convs), tuple(recs), n_commit_B is None)
    return ForwardOut(logits, new, tuple(tapped[i] for i in taps), h_BTD)
