"""The decoder stack for the Qwen3 dense family and Llama, as one Flax module.

Shapes (docs/design.md, "Shape letters"): B batch, T new tokens, S cache slots, D model, F mlp,
N query heads, K kv heads, G = N / K query heads per kv head, H head dim, V vocabulary, X heads x
head dim flattened (a projection's output before it is split into heads), P positions whose
logits are read.

The KV cache is static: slot s holds the token at absolute position s. A forward writes K/V at
`positions` and attends to slots <= each query's position, so slots beyond a row's length are
masked until a later write overwrites them: rollback of rejected drafts is just a smaller length.
A draft tree's forward (`TreeMask`) writes node i at slot root + i and attends by ancestry.

An FP8 cache (float8_e4m3fn) stores clip(x / scale, +-448) and attention reads f32(code) * scale in
the compute dtype, with one k and one v scale per layer: the attention params `k_scale` / `v_scale`
(float32 scalars, loaded from an FP8-KV checkpoint or set by `Model.with_fp8_kv`), 1.0 where the
params hold none. Caches of any other dtype ignore the scales.
"""

import functools
from typing import NamedTuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from specdec import sharding
from specdec.models.config import ModelConfig
from specdec.models.rope import apply_rope, inv_freq_and_scale
from specdec.ops.attention import TreeMask, attend
from specdec.ops.kv_cache import KV_SCALES, check_kv_dtype, move_slots, write_cache
from specdec.ops.qmatmul import matmul


@flax.struct.dataclass
class KVCache:
  k: tuple[jax.Array, ...]  # per layer [B, S, K, H]
  v: tuple[jax.Array, ...]

  @staticmethod
  def zeros(c: ModelConfig, batch: int, slots: int, dtype=jnp.bfloat16) -> "KVCache":
    dtype = check_kv_dtype(dtype)
    shape = (batch, slots, c.num_kv_heads, c.head_dim)
    z = tuple(jnp.zeros(shape, dtype) for _ in range(c.num_layers))
    return KVCache(k=z, v=z)

  @property
  def slots(self) -> int:
    return self.k[0].shape[1]

  def settle(self, n_B) -> "KVCache":
    """The cache a step commits: this one as it is (stale slots past `lengths` are masked)."""
    del n_B
    return self

  def move(self, src_BT, dst_BT) -> "KVCache":
    """Every layer's K/V at slots src_BT copied to dst_BT (`move_slots`; dst >= S dropped)."""
    k = tuple(move_slots(x, src_BT, dst_BT) for x in self.k)
    return KVCache(k=k, v=tuple(move_slots(x, src_BT, dst_BT) for x in self.v))


class ForwardOut(NamedTuple):
  logits: jax.Array  # [B, T or P, V] float32
  cache: KVCache
  taps: tuple[jax.Array, ...]  # hidden [B, T, D] after each requested layer
  hidden: jax.Array  # final-norm hidden [B, T, D] (what the LM head reads)


class RMSNorm(nn.Module):
  eps: float

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
    # HF casts back to the input dtype before the scale; matching it keeps bf16 parity.
    return scale.astype(x.dtype) * y.astype(x.dtype)


class Linear(nn.Module):
  """y = x @ W (+ b); W is stored (in, out) and may be a quantized weight type."""

  features: int
  use_bias: bool = False

  @nn.compact
  def __call__(self, x):
    if self.has_variable("params", "kernel"):
      # Read, not `param`: a quantized kernel is a pytree whose leaves have other shapes.
      w = self.get_variable("params", "kernel")
    else:
      w = self.param("kernel", nn.initializers.normal(0.02), (x.shape[-1], self.features))
    y = matmul(x, w, split=sharding.split_of(self.name))
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros, (self.features,)).astype(y.dtype)
    return y


class Attention(nn.Module):
  config: ModelConfig

  def kv_scale(self, name: str):
    # Read, not `param`: only FP8-KV models carry scales, and init must not invent them.
    if self.has_variable("params", name):
      return self.get_variable("params", name).astype(jnp.float32)
    return 1.0

  @nn.compact
  def __call__(self, x_BTD, positions_BT, k_BSKH, v_BSKH, tree=None, from_zero=False):
    c = self.config
    B, T, _ = x_BTD.shape
    N, K, H = c.num_heads, c.num_kv_heads, c.head_dim
    if self.has_variable("params", "qkv_proj"):  # specdec.models.fuse: one matmul for all three
      qkv_BTX = Linear((N + 2 * K) * H, c.attention_bias, name="qkv_proj")(x_BTD)
      q_BTX, k_BTX, v_BTX = jnp.split(qkv_BTX, [N * H, (N + K) * H], axis=-1)
    else:
      q_BTX = Linear(N * H, c.attention_bias, name="q_proj")(x_BTD)
      k_BTX = Linear(K * H, c.attention_bias, name="k_proj")(x_BTD)
      v_BTX = Linear(K * H, c.attention_bias, name="v_proj")(x_BTD)
    q_BTNH = q_BTX.reshape(B, T, N, H)
    k_BTKH = k_BTX.reshape(B, T, K, H)
    v_BTKH = v_BTX.reshape(B, T, K, H)
    if c.qk_norm:
      q_BTNH = RMSNorm(c.rms_norm_eps, name="q_norm")(q_BTNH)
      k_BTKH = RMSNorm(c.rms_norm_eps, name="k_norm")(k_BTKH)
    inv_freq, scale = inv_freq_and_scale(c)
    q_BTNH = apply_rope(q_BTNH, positions_BT, inv_freq, scale)
    k_BTKH = apply_rope(k_BTKH, positions_BT, inv_freq, scale)
    k_scale, v_scale = (self.kv_scale(n) for n in KV_SCALES)
    slots_BT = positions_BT if tree is None else tree.slots_BT
    k_BSKH = write_cache(k_BSKH, k_BTKH, slots_BT, k_scale)
    v_BSKH = write_cache(v_BSKH, v_BTKH, slots_BT, v_scale)
    o_BTNH = attend(q_BTNH, k_BSKH, v_BSKH, positions_BT, k_scale, v_scale, tree, from_zero)
    out_BTD = Linear(c.hidden_size, c.attention_bias, name="o_proj")(o_BTNH.reshape(B, T, N * H))
    return out_BTD, k_BSKH, v_BSKH


class MLP(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BTD):
    c = self.config
    F = c.intermediate_size
    if self.has_variable("params", "gate_up_proj"):  # specdec.models.fuse
      gate_BTF, up_BTF = jnp.split(Linear(2 * F, c.mlp_bias, name="gate_up_proj")(x_BTD), 2, -1)
    else:
      gate_BTF = Linear(F, c.mlp_bias, name="gate_proj")(x_BTD)
      up_BTF = Linear(F, c.mlp_bias, name="up_proj")(x_BTD)
    return Linear(c.hidden_size, c.mlp_bias, name="down_proj")(jax.nn.silu(gate_BTF) * up_BTF)


class Block(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, positions_BT, k_BSKH, v_BSKH, tree=None, from_zero=False):
    c = self.config
    h_BTD = RMSNorm(c.rms_norm_eps, name="attn_norm")(x_BTD)
    attn = Attention(c, name="attn")
    a_BTD, k_BSKH, v_BSKH = attn(h_BTD, positions_BT, k_BSKH, v_BSKH, tree, from_zero)
    x_BTD = x_BTD + a_BTD
    x_BTD = x_BTD + MLP(c, name="mlp")(RMSNorm(c.rms_norm_eps, name="mlp_norm")(x_BTD))
    return x_BTD, k_BSKH, v_BSKH


@functools.partial(jax.jit, static_argnames=("layer", "static"), inline=True)
def apply_layer(variables, args, *, layer: nn.Module, static: tuple = ()):
  """`layer.apply(variables, *args, *static)` as a jitted function. A stack's layers share their
  shapes, and an unbound flax module hashes by its fields, so jax traces a layer once per (module
  fields, shapes) and lowers it once per program, kernels included, where a Python loop of layer
  calls traces and lowers every layer. inline=True (jax.Inline.JAX_LATE) splices that lowering in
  at each layer: XLA gets the program the loop gives. `static`: the call's Python arguments."""
  return layer.apply(variables, *args, *static)


class Transformer(nn.Module):
  config: ModelConfig
  dtype: jnp.dtype = jnp.bfloat16

  def setup(self):
    c = self.config
    self.embed = nn.Embed(c.vocab_size, c.hidden_size, param_dtype=self.dtype, name="embed")
    self.blocks = [Block(c, name=f"layer_{i}") for i in range(c.num_layers)]
    self.final_norm = RMSNorm(c.rms_norm_eps, name="final_norm")
    if not c.tie_word_embeddings:
      self.lm_head = Linear(c.vocab_size, name="lm_head")

  def embed_tokens(self, tokens_BT):
    return self.embed(tokens_BT).astype(self.dtype)

  def head(self, h_BTD):
    """Final-norm hidden -> float32 logits (drafters sharing the target's head call this)."""
    if self.config.tie_word_embeddings:
      return self.embed.attend(h_BTD).astype(jnp.float32)
    return self.lm_head(h_BTD).astype(jnp.float32)

  def __call__(
    self,
    tokens_BT,
    positions_BT,
    cache: KVCache,
    taps: tuple[int, ...] = (),
    logits_at_BP=None,
    inputs_BTD=None,
    n_commit_B=None,
    tree: TreeMask | None = None,
    from_zero: bool = False,
  ) -> ForwardOut:
    """One forward over T new tokens at `positions`, writing their K/V into `cache`.

    taps: layer indices whose outputs are returned (tap i = output of decoder layer i).
    logits_at_BP: optional indices into T; only those positions go through the LM head.
    inputs_BTD: embeddings to use instead of embedding `tokens_BT`.
    n_commit_B: unused; a KV cache needs no commit count (the hybrid stack's state does).
    tree: the tokens are nodes of a draft tree: K/V go to the tree's slots and attention follows
    its ancestors (`TreeMask`); positions are then each node's root + depth.
    from_zero: positions are 0..T-1 in every row over a cache of T slots (`attend`'s fast path).
    """
    del n_commit_B
    x_BTD = self.embed_tokens(tokens_BT) if inputs_BTD is None else inputs_BTD.astype(self.dtype)
    ks, vs, tapped = [], [], {}
    for i, block in enumerate(self.blocks):
      if tree is None and not self.is_initializing():
        x_BTD, k, v = apply_layer(
          block.variables, (x_BTD, positions_BT, cache.k[i], cache.v[i]),
          layer=Block(self.config, parent=None), static=(None, from_zero),
        )  # fmt: skip
      else:
        x_BTD, k, v = block(x_BTD, positions_BT, cache.k[i], cache.v[i], tree, from_zero)
      ks.append(k)
      vs.append(v)
      tapped[i] = x_BTD
    logits, h_BTD = self.read_out(x_BTD, logits_at_BP)
    return ForwardOut(
      logits=logits,
      cache=KVCache(k=tuple(ks), v=tuple(vs)),
      taps=tuple(tapped[i] for i in taps),
      hidden=h_BTD,
    )

  def read_out(self, x_BTD, logits_at_BP):
    """(logits at logits_at_BP, every position where None; the final-norm hidden [B, T, D])."""
    h_BTD = self.final_norm(x_BTD)
    h_sel = h_BTD
    if logits_at_BP is not None:
      h_sel = jnp.take_along_axis(h_BTD, logits_at_BP[:, :, None], axis=1)
    return self.head(h_sel), h_BTD
