"""The Gated DeltaNet token mixer of Qwen3-Next (linear attention with a short causal conv).

  x -> in_proj_qkvz, in_proj_ba -> causal conv + silu over [q, k, v] -> l2-normed q, k
    -> the gated delta rule (specdec.ops.gdn) with beta = sigmoid(b), g = -exp(A_log)
       softplus(a + dt_bias) -> RMSNorm(o) * silu(z) per value head -> out_proj

Its state per row is the conv window (the last Z - 1 inputs, channels grouped by key head) and
the recurrent state [Y, H, U].
Given `n_commit_B`, the forward keeps only the first n tokens of each row in the state (padding
after them is a no-op) and returns that state (prefill, full forwards). Without it, it returns the
state after every token, for the commit to pick from (`HybridCache.settle`): verify.

Shapes: Q q/k heads of head dim H, Y value heads of dim U (Y a multiple of Q: key head i serves
value heads i r .. i r + r - 1), Z conv taps, X = 2 Q H + Y U conv channels, w window rows.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec.models.config import HybridConfig
from specdec.models.transformer import Linear
from specdec.ops import gdn


def _by_key_head(Q: int, H: int, V: int) -> np.ndarray:
  """Indices into the conv channels [q (Q H) | k (Q H) | v (Q V)] that group them by key head."""
  q_QH, k_QH = np.arange(Q * H).reshape(Q, H), Q * H + np.arange(Q * H).reshape(Q, H)
  v_QV = 2 * Q * H + np.arange(Q * V).reshape(Q, V)
  return np.concatenate([q_QH, k_QH, v_QV], 1).reshape(-1)


class GatedDeltaNet(nn.Module):
  config: HybridConfig

  @nn.compact
  def __call__(self, x_BTD, conv_BwX, rec_BYHU, n_commit_B=None):
    c = self.config
    B, T, _ = x_BTD.shape
    Q, Y = c.linear_num_key_heads, c.linear_num_value_heads
    H, U, Z = c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel
    r = Y // Q
    dt = x_BTD.dtype
    # Grouped by key head: [q (H), k (H), v (r U), z (r U)] and [b (r), a (r)].
    qkvz_BTQX = Linear(2 * Q * H + 2 * Y * U, name="in_proj_qkvz")(x_BTD).reshape(B, T, Q, -1)
    q_BTQH, k_BTQH, v_BTQX, z_BTQX = jnp.split(qkvz_BTQX, [H, 2 * H, 2 * H + r * U], -1)
    ba_BTQX = Linear(2 * Y, name="in_proj_ba")(x_BTD).reshape(B, T, Q, 2 * r)
    b_BTY, a_BTY = ba_BTQX[..., :r].reshape(B, T, Y), ba_BTQX[..., r:].reshape(B, T, Y)
    # The conv channels stay grouped by key head ([q_i, k_i, v_i] per head i, as the projection
    # yields them), so a split by key heads gives each device whole heads of the conv and its
    # state. The kernel, stored as [q | k | v] (HF's order), is gathered into that order (the
    # conv is depthwise): a gather, not slices, so a partitioner splitting its output by heads
    # reads each device's rows of the replicated kernel and moves nothing between devices.
    mixed_BTX = jnp.concatenate([q_BTQH, k_BTQH, v_BTQX], -1).reshape(B, T, -1)
    kernel_X1Z = self.param("conv1d", nn.initializers.normal(0.3), (c.conv_dim, 1, Z))
    kernel_XZ = kernel_X1Z[_by_key_head(Q, H, r * U), 0]
    mixed_BTX, win_BwX = gdn.causal_conv(mixed_BTX, conv_BwX, kernel_XZ)
    mixed_BTQX = mixed_BTX.reshape(B, T, Q, -1)
    q_BTYH = jnp.repeat(mixed_BTQX[..., :H], r, axis=2)
    k_BTYH = jnp.repeat(mixed_BTQX[..., H : 2 * H], r, axis=2)
    v_BTYU = mixed_BTQX[..., 2 * H :].reshape(B, T, Y, U)
    a_log_Y = self.param("A_log", nn.initializers.zeros, (Y,))
    dt_bias_Y = self.param("dt_bias", nn.initializers.ones, (Y,))
    beta_BTY = jax.nn.sigmoid(b_BTY).astype(jnp.float32)
    g_BTY = -jnp.exp(a_log_Y.astype(jnp.float32)) * jax.nn.softplus(
      a_BTY.astype(jnp.float32) + dt_bias_Y.astype(jnp.float32)
    )
    q_BTYH = gdn.l2norm(q_BTYH) * H**-0.5
    k_BTYH = gdn.l2norm(k_BTYH)
    if n_commit_B is None:
      o_BTYU, s_BTYHU = gdn.per_token(q_BTYH, k_BTYH, v_BTYU, g_BTY, beta_BTY, rec_BYHU)
      conv_BwX = win_BwX
      rec = jnp.concatenate([rec_BYHU[:, None].astype(jnp.float32), s_BTYHU], 1)
    else:
      live_BT1 = (jnp.arange(T)[None, :] < n_commit_B[:, None])[..., None]
      g_BTY, beta_BTY = jnp.where(live_BT1, g_BTY, 0.0), jnp.where(live_BT1, beta_BTY, 0.0)
      o_BTYU, rec = gdn.chunked(q_BTYH, k_BTYH, v_BTYU, g_BTY, beta_BTY, rec_BYHU)
      conv_BwX = gdn.conv_state_at(win_BwX, n_commit_B, Z)
    # The output norm: RMSNorm per value head, cast back, then gated by silu(z) in float32.
    o32 = o_BTYU.astype(dt).astype(jnp.float32)
    scale_U = self.param("norm", nn.initializers.ones, (U,))
    y = (o32 * jax.lax.rsqrt(jnp.mean(o32 * o32, -1, keepdims=True) + c.rms_norm_eps)).astype(dt)
    y_BTYU = scale_U.astype(dt) * y
    y_BTYU = (y_BTYU * jax.nn.silu(z_BTQX.reshape(B, T, Y, U).astype(jnp.float32))).astype(dt)
    out_BTD = Linear(c.hidden_size, name="out_proj")(y_BTYU.reshape(B, T, Y * U))
    return out_BTD, conv_BwX, rec
