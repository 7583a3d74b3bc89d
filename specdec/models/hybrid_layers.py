"""The Qwen3-Next / Qwen3-MoE sublayers besides Gated DeltaNet: the zero-centred RMSNorm, gated
attention with partial RoPE, and the routed-expert MLP with its optional shared expert.

Shapes as in transformer.py, plus I routed experts, e of them per token, M token rows.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec.models.config import HybridConfig
from specdec.models.rope import apply_rope, inv_freq_and_scale
from specdec.models.transformer import MLP, Linear, RMSNorm
from specdec.ops import moe
from specdec.ops.attention import attend
from specdec.ops.kv_cache import write_cache


class ZeroCentredRMSNorm(nn.Module):
  """Qwen3-Next's norm: y = norm(x) * (1 + w), all in float32, then cast back."""

  eps: float

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.zeros, (x.shape[-1],))
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
    return (y * (1.0 + scale.astype(jnp.float32))).astype(x.dtype)


def rms_norm(c: HybridConfig, name: str) -> nn.Module:
  return (ZeroCentredRMSNorm if c.norm_plus_one else RMSNorm)(c.rms_norm_eps, name=name)


def _partial_rope(x_BTNH, positions_BT, c: HybridConfig):
  """RoPE on the first rotary_dim of each head; the rest passes through."""
  R = c.rotary_dim
  inv_freq, scale = inv_freq_and_scale(c.replace(head_dim=R))
  turned = apply_rope(x_BTNH[..., :R], positions_BT, inv_freq, scale)
  return jnp.concatenate([turned, x_BTNH[..., R:]], -1)


class GatedAttention(nn.Module):
  """Full attention over the static KV cache; Qwen3-Next also gates the output per head with
  sigmoid(g), g from the second half of each head's q_proj output."""

  config: HybridConfig

  @nn.compact
  def __call__(self, x_BTD, positions_BT, k_BSKH, v_BSKH, from_zero=False):
    c = self.config
    B, T, _ = x_BTD.shape
    N, K, H = c.num_heads, c.num_kv_heads, c.head_dim
    parts = 2 if c.attn_output_gate else 1
    q_BTNX = Linear(N * H * parts, c.attention_bias, name="q_proj")(x_BTD).reshape(B, T, N, -1)
    q_BTNH = q_BTNX[..., :H]
    k_BTKH = Linear(K * H, c.attention_bias, name="k_proj")(x_BTD).reshape(B, T, K, H)
    v_BTKH = Linear(K * H, c.attention_bias, name="v_proj")(x_BTD).reshape(B, T, K, H)
    q_BTNH = _partial_rope(rms_norm(c, "q_norm")(q_BTNH), positions_BT, c)
    k_BTKH = _partial_rope(rms_norm(c, "k_norm")(k_BTKH), positions_BT, c)
    k_BSKH = write_cache(k_BSKH, k_BTKH, positions_BT)
    v_BSKH = write_cache(v_BSKH, v_BTKH, positions_BT)
    o_BTNH = attend(q_BTNH, k_BSKH, v_BSKH, positions_BT, from_zero=from_zero)
    if c.attn_output_gate:
      o_BTNH = o_BTNH * jax.nn.sigmoid(q_BTNX[..., H:])
    out_BTD = Linear(c.hidden_size, c.attention_bias, name="o_proj")(o_BTNH.reshape(B, T, N * H))
    return out_BTD, k_BSKH, v_BSKH


class Experts(nn.Module):
  """The routed experts' SwiGLU weights, stacked: gate/up [I, D, F], down [I, F, D]."""

  config: HybridConfig

  @nn.compact
  def __call__(self, x_MD, w_Me, ids_Me):
    c = self.config
    I, D, F = c.num_experts, c.hidden_size, c.moe_intermediate_size
    init = nn.initializers.normal(0.02)
    gate_IDF = self.param("gate_proj", init, (I, D, F))
    up_IDF = self.param("up_proj", init, (I, D, F))
    down_IFD = self.param("down_proj", init, (I, F, D))
    return moe.experts(x_MD, w_Me, ids_Me, gate_IDF, up_IDF, down_IFD)


class MoEBlock(nn.Module):
  """Router top-e (weights renormalized when norm_topk_prob) over the experts, plus the shared
  expert scaled by sigmoid(shared_expert_gate(x)) where the config has one."""

  config: HybridConfig

  @nn.compact
  def __call__(self, x_BTD):
    c = self.config
    x_MD = x_BTD.reshape(-1, c.hidden_size)
    logits_MI = Linear(c.num_experts, name="router")(x_MD)
    w_Me, ids_Me = moe.route(logits_MI, c.num_experts_per_tok, c.norm_topk_prob)
    y_MD = Experts(c, name="experts")(x_MD, w_Me, ids_Me)
    if c.shared_expert_intermediate_size:
      shared = c.replace(intermediate_size=c.shared_expert_intermediate_size)
      s_MD = MLP(shared, name="shared_expert")(x_MD)
      y_MD = y_MD + jax.nn.sigmoid(Linear(1, name="shared_expert_gate")(x_MD)) * s_MD
    return y_MD.reshape(x_BTD.shape)
