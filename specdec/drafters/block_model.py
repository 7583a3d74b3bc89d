"""The block drafter's network (DFlash, DFlash2) as Flax modules, for inference and training alike.

Shapes (docs/design.md, "Shape letters"): B batch, R query rows (one or more blocks of b rows laid
out contiguously), S context slots (in `_attend`: one key group's rows), E extra key rows, D model,
N/K/G/H heads, X fused-tap width (n_taps x D), P drafted positions, c candidates, r selector rank.

Context: the target's hidden states after `target_layer_ids`, concatenated [.., n_taps * D], become
`hidden_norm(fc(taps))`; every draft layer projects that one feature into its own K/V
(k_norm + RoPE at the context position). The layer's queries come only from block rows. A row at
absolute position q of a block anchored at a sees:
  context slot s   iff s < a                  (causal to the context: only committed positions)
  block row at p   iff same block             (bidirectional inside the block; in a causal
                                              layer only rows p <= q)
  extra key at p   always                     (earlier chained blocks, see `block.py`)
and, in a layer with a sliding window w, only keys with |q - p| < w (the per-query distance rule
of the DFlash2 reference; it bounds what the drafter reads, not the cache size).

DFlash2 adds a two-sided dynamic grouped causal conv around each sublayer (`DynamicConv`) and the
low-rank candidate selector (`Selector`); DSpark a sequential logit bias from the previous token
(`MarkovHead`) and an acceptance predictor (`ConfidenceHead`, loaded, not used to draft); each is
documented where defined.
"""

import functools
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec.drafters.block_config import BlockConfig
from specdec.models.rope import apply_rope, inv_freq_and_scale
from specdec.models.transformer import MLP, Linear, RMSNorm


class Rows(NamedTuple):
  """Where each query row sits: absolute position, its block's anchor position, block id, and the
  row's offset inside its block (0 = the anchor)."""

  pos_BR: jax.Array
  anchor_BR: jax.Array
  block_BR: jax.Array
  offset_BR: jax.Array


class Extra(NamedTuple):
  """Additional keys per layer with their absolute positions (visible to every row)."""

  k: tuple[jax.Array, ...]  # per layer [B, E, K, H]
  v: tuple[jax.Array, ...]
  pos_BE: jax.Array


def _in_window(dist, window):
  return jnp.ones(dist.shape, bool) if window is None else jnp.abs(dist) < window


def _attend(q_BRNH, groups):
  """One softmax over several key groups, each (k_BSKH, v_BSKH, visible_BRS) with S that group's
  key rows: the context cache is read in place instead of being concatenated with the block's
  keys."""
  B, R, N, H = q_BRNH.shape
  K = groups[0][0].shape[2]
  q_BRKGH = q_BRNH.reshape(B, R, K, N // K, H)
  scores = []
  for k_BSKH, _, vis_BRS in groups:
    s = jnp.einsum("BRKGH,BSKH->BRKGS", q_BRKGH, k_BSKH, preferred_element_type=jnp.float32)
    scores.append(jnp.where(vis_BRS[:, :, None, None, :], s * (H**-0.5), -1e30))
  p = jax.nn.softmax(jnp.concatenate(scores, -1), axis=-1)  # [B, R, K, G, all groups' rows]
  out, at = 0.0, 0
  for k_BSKH, v_BSKH, _ in groups:
    n = k_BSKH.shape[1]
    p_BRKGS = p[..., at : at + n].astype(v_BSKH.dtype)
    out = out + jnp.einsum("BRKGS,BSKH->BRKGH", p_BRKGS, v_BSKH, preferred_element_type=jnp.float32)
    at += n
  return out.reshape(B, R, N, H).astype(q_BRNH.dtype)


class DraftAttention(nn.Module):
  cfg: BlockConfig
  window: int | None
  causal: bool = False

  def setup(self):
    c = self.cfg.layers
    N, K, H = c.num_heads, c.num_kv_heads, c.head_dim
    self.q_proj = Linear(N * H, c.attention_bias)
    self.k_proj = Linear(K * H, c.attention_bias)
    self.v_proj = Linear(K * H, c.attention_bias)
    self.o_proj = Linear(c.hidden_size, c.attention_bias)
    self.q_norm = RMSNorm(c.rms_norm_eps)
    self.k_norm = RMSNorm(c.rms_norm_eps)

  def _rope(self, x_BTNH, pos_BT):
    inv_freq, scale = inv_freq_and_scale(self.cfg.layers)
    return apply_rope(x_BTNH, pos_BT, inv_freq, scale)

  def kv(self, x_BTD, pos_BT):
    """K/V of context features or block rows: k_norm(k_proj(x)) rotated at `pos`, v_proj(x)."""
    c = self.cfg.layers
    B, T, _ = x_BTD.shape
    k_BTKH = self.k_norm(self.k_proj(x_BTD).reshape(B, T, c.num_kv_heads, c.head_dim))
    v_BTKH = self.v_proj(x_BTD).reshape(B, T, c.num_kv_heads, c.head_dim)
    return self._rope(k_BTKH, pos_BT), v_BTKH

  def __call__(self, x_BRD, rows: Rows, ctx_k_BSKH, ctx_v_BSKH, extra_kv):
    c = self.cfg.layers
    B, R, _ = x_BRD.shape
    q_BRNH = self.q_norm(self.q_proj(x_BRD).reshape(B, R, c.num_heads, c.head_dim))
    q_BRNH = self._rope(q_BRNH, rows.pos_BR)
    k_BRKH, v_BRKH = self.kv(x_BRD, rows.pos_BR)
    w = self.window
    slots_S = jnp.arange(ctx_k_BSKH.shape[1])
    ctx_vis_BRS = (slots_S[None, None, :] < rows.anchor_BR[:, :, None]) & _in_window(
      rows.pos_BR[:, :, None] - slots_S[None, None, :], w
    )
    dist_BRR = rows.pos_BR[:, :, None] - rows.pos_BR[:, None, :]
    own_vis_BRR = (rows.block_BR[:, :, None] == rows.block_BR[:, None, :]) & _in_window(dist_BRR, w)
    if self.causal:
      own_vis_BRR = own_vis_BRR & (dist_BRR >= 0)
    groups = [(ctx_k_BSKH, ctx_v_BSKH, ctx_vis_BRS), (k_BRKH, v_BRKH, own_vis_BRR)]
    if extra_kv is not None:
      ek_BEKH, ev_BEKH, pos_BE = extra_kv
      groups.append((ek_BEKH, ev_BEKH, _in_window(rows.pos_BR[:, :, None] - pos_BE[:, None], w)))
    o_BRNH = _attend(q_BRNH, groups)
    return self.o_proj(o_BRNH.reshape(B, R, -1)), k_BRKH, v_BRKH


def grouped_conv(x_BRD, delta, base, offset_BR):
  """out_t = sum_j (base[j] + delta_t[j]) * x_{t-j}, taps j = 0 (current row), 1, ...; a tap that
  would read before the row's block start reads zero (taps never cross a block boundary).

  delta [B, R, taps, groups] (one correction per row, tap and channel group), base [taps, D]; the
  grouped arrays below are x viewed as [B, R, groups, D / groups]."""
  B, R, D = x_BRD.shape
  taps, groups = delta.shape[2], delta.shape[3]
  xg = x_BRD.reshape(B, R, groups, D // groups)
  coef = base.reshape(taps, groups, D // groups).astype(x_BRD.dtype) + delta[..., None]
  out = coef[:, :, 0] * xg
  for j in range(1, taps):
    shifted = jnp.pad(xg[:, :-j], ((0, 0), (j, 0), (0, 0), (0, 0)))
    keep_BR11 = (offset_BR >= j)[:, :, None, None]
    out = out + jnp.where(keep_BR11, coef[:, :, j] * shifted, 0)
  return out.reshape(B, R, D)


class DynamicConv(nn.Module):
  """DFlash2's conv around one sublayer. `kernel_projection` maps the sublayer's (normed) input to
  per-row, per-group coefficient corrections for both sides at once ([2, taps, groups] per row);
  `base_kernel` [2, taps, D] is the learned base (side 0 before the sublayer, side 1 after).
  Returns the convolved input and what `grouped_conv` needs to convolve the sublayer output.

  Initialised as the identity (base tap 0 = 1, everything else 0), so training starts at DFlash.
  """

  taps: int
  group_size: int

  @nn.compact
  def __call__(self, x_BRD, offset_BR):
    B, R, D = x_BRD.shape
    taps, groups = self.taps, D // self.group_size

    def identity(key, shape, dtype=jnp.float32):
      return jnp.zeros(shape, dtype).at[:, 0].set(1)

    base = self.param("base_kernel", identity, (2, taps, D))  # [side, taps, D]
    delta = Linear(2 * taps * groups, name="kernel_projection")(x_BRD)
    delta = delta.reshape(B, R, 2, taps, groups)  # [B, R, side, taps, groups]
    y_BRD = grouped_conv(x_BRD, delta[:, :, 0], base[0], offset_BR)
    return y_BRD, (delta[:, :, 1], base[1])


class DraftLayer(nn.Module):
  cfg: BlockConfig
  window: int | None
  causal: bool = False

  def setup(self):
    c = self.cfg.layers
    self.attn_norm = RMSNorm(c.rms_norm_eps)
    self.attn = DraftAttention(self.cfg, self.window, self.causal)
    self.mlp_norm = RMSNorm(c.rms_norm_eps)
    self.mlp = MLP(c)
    if self.cfg.conv:
      self.attention_conv = DynamicConv(self.cfg.conv_kernel_size, self.cfg.conv_group_size)
      self.mlp_conv = DynamicConv(self.cfg.conv_kernel_size, self.cfg.conv_group_size)

  def context_kv(self, ctx_BTD, pos_BT):
    return self.attn.kv(ctx_BTD, pos_BT)

  def __call__(self, x_BRD, rows: Rows, ctx_k, ctx_v, extra_kv):
    conv, off_BR = self.cfg.conv, rows.offset_BR
    h_BRD = self.attn_norm(x_BRD)
    if conv:
      h_BRD, (delta, base) = self.attention_conv(h_BRD, off_BR)
    a_BRD, k_BRKH, v_BRKH = self.attn(h_BRD, rows, ctx_k, ctx_v, extra_kv)
    if conv:
      a_BRD = grouped_conv(a_BRD, delta, base, off_BR)
    x_BRD = x_BRD + a_BRD
    h_BRD = self.mlp_norm(x_BRD)
    if conv:
      h_BRD, (delta, base) = self.mlp_conv(h_BRD, off_BR)
    m_BRD = self.mlp(h_BRD)
    if conv:
      m_BRD = grouped_conv(m_BRD, delta, base, off_BR)
    return x_BRD + m_BRD, k_BRKH, v_BRKH


class Selector(nn.Module):
  """DFlash2's pairwise candidate selector: S_t(a, b) = U_t(b) + <A(a) * H(h_t), B(b)>, with A the
  predecessor codebook, B the successor codebook [V, rank] and H a rank-wide projection of the
  draft's final hidden state. This module returns the bilinear term; U is the draft's own logit."""

  vocab: int
  rank: int

  @nn.compact
  def __call__(self, h_BPD, pred_BPp, cand_BPc):
    init = nn.initializers.normal(1.0)
    a_Vr = self.param("predecessor_codebook", init, (self.vocab, self.rank))
    b_Vr = self.param("successor_codebook", init, (self.vocab, self.rank))
    proj_BPr = Linear(self.rank, name="hidden_projection")(h_BPD).astype(jnp.float32)
    a_BPpr = a_Vr[pred_BPp].astype(jnp.float32)
    b_BPcr = b_Vr[cand_BPc].astype(jnp.float32)
    return jnp.einsum("BPpr,BPr,BPcr->BPpc", a_BPpr, proj_BPr, b_BPcr)


class MarkovHead(nn.Module):
  """DSpark's low-rank sequential bias on the draft logits of block row k, from the token before
  the one that row drafts: e = w1[prev] (rank r), then
    vanilla  bias = w2(e)
    gated    bias = w2(sigmoid(gate_proj([h, e])) * e)
    rnn      [g, c, o] = joint_proj([state, e, h]); state' = sigmoid(g) state + (1 - sigmoid(g))
             tanh(c); bias = w2(tanh(o))       (the state runs over every row of the block)
  h is the row's final-norm hidden; the bias is over the draft vocabulary."""

  vocab: int
  out: int
  rank: int
  kind: str

  def setup(self):
    self.markov_w1 = self.param("markov_w1", nn.initializers.normal(0.01), (self.vocab, self.rank))
    self.markov_w2 = Linear(self.out)
    if self.kind == "gated":
      self.gate_proj = Linear(self.rank, use_bias=True)
    if self.kind == "rnn":
      self.joint_proj = Linear(3 * self.rank, use_bias=True)

  def __call__(self, state_Br, prev_B, h_BD):
    """One row: (bias [B, out] float32, next state [B, r])."""
    e_Br = self.markov_w1[prev_B].astype(jnp.float32)
    h_BD = h_BD.astype(jnp.float32)
    if self.kind == "gated":
      e_Br = jax.nn.sigmoid(self.gate_proj(jnp.concatenate([h_BD, e_Br], -1))) * e_Br
    elif self.kind == "rnn":
      z_BX = jnp.concatenate([state_Br, e_Br, h_BD], -1)
      g_Br, c_Br, o_Br = jnp.split(self.joint_proj(z_BX), 3, -1)
      g_Br = jax.nn.sigmoid(g_Br)
      state_Br = g_Br * state_Br + (1 - g_Br) * jnp.tanh(c_Br)
      e_Br = jnp.tanh(o_Br)
    return self.markov_w2(e_Br).astype(jnp.float32), state_Br


class ConfidenceHead(nn.Module):
  """DSpark's per-row acceptance logit (proj of [h] or [h, w1[prev]]): vLLM schedules draft
  lengths with it; specdec's fixed-k step does not, so it is carried for round trips only."""

  @nn.compact
  def __call__(self, x_BPX):
    return Linear(1, use_bias=True, name="proj")(x_BPX)[..., 0]


class BlockDraft(nn.Module):
  cfg: BlockConfig

  def setup(self):
    c = self.cfg.layers
    self.fc = Linear(c.hidden_size)
    self.hidden_norm = RMSNorm(c.rms_norm_eps)
    self.layers = [
      DraftLayer(self.cfg, self.cfg.window(i), self.cfg.is_causal(i), name=f"layer_{i}")
      for i in range(c.num_layers)
    ]
    self.final_norm = RMSNorm(c.rms_norm_eps)
    if self.cfg.selector:
      self.selector = Selector(c.vocab_size, self.cfg.selector_rank)
    if self.cfg.reduced_vocab:
      self.lm_head = Linear(self.cfg.draft_vocab_size)
    if self.cfg.markov:
      out = self.cfg.draft_vocab_size or c.vocab_size
      cfg = self.cfg
      self.markov_head = MarkovHead(c.vocab_size, out, cfg.markov_rank, cfg.markov_head_type)
    if self.cfg.confidence_head:
      self.confidence_head = ConfidenceHead()

  def context(self, taps_BTX, pos_BT):
    """Fused taps [B, T, n_taps * D] -> per-layer context (k [B, T, K, H], v) at `pos`."""
    ctx_BTD = self.hidden_norm(self.fc(taps_BTX))
    kvs = [layer.context_kv(ctx_BTD, pos_BT) for layer in self.layers]
    return tuple(k for k, _ in kvs), tuple(v for _, v in kvs)

  def __call__(self, x_BRD, rows: Rows, ctx_k, ctx_v, extra: Extra | None = None):
    """Block rows' input embeddings -> (final-norm hidden [B, R, D], per-layer row K/V)."""
    ks, vs = [], []
    for i, layer in enumerate(self.layers):
      e = None if extra is None else (extra.k[i], extra.v[i], extra.pos_BE)
      x_BRD, k_BRKH, v_BRKH = layer(x_BRD, rows, ctx_k[i], ctx_v[i], e)
      ks.append(k_BRKH)
      vs.append(v_BRKH)
    return self.final_norm(x_BRD), (tuple(ks), tuple(vs))

  def select(self, h_BPD, pred_BPp, cand_BPc):
    return self.selector(h_BPD, pred_BPp, cand_BPc)

  def markov_bias(self, state_Br, prev_B, h_BD):
    return self.markov_head(state_Br, prev_B, h_BD)

  def confidence(self, x_BPX):
    """DSpark's acceptance logit per row [B, P] (input: `training.block.confidence_input`)."""
    return self.confidence_head(x_BPX)

  def draft_head(self, h_BPD):
    """float32 logits over the draft's own vocabulary [.., Vd] (a reduced-vocabulary draft)."""
    return self.lm_head(h_BPD).astype(jnp.float32)

  def init_all(self, taps_BTX, x_BRD, rows: Rows):
    """Touches every parameter (for `init`)."""
    T = taps_BTX.shape[1]
    pos_BT = jnp.broadcast_to(jnp.arange(T), taps_BTX.shape[:2])
    ks, vs = self.context(taps_BTX, pos_BT)
    h_BRD, _ = self(x_BRD, rows, ks, vs)
    if self.cfg.selector:
      tok_BR1 = jnp.zeros(h_BRD.shape[:2] + (1,), jnp.int32)
      self.select(h_BRD, tok_BR1, tok_BR1)
    if self.cfg.reduced_vocab:
      self.draft_head(h_BRD)
    B = h_BRD.shape[0]
    if self.cfg.markov:
      state = jnp.zeros((B, self.cfg.markov_rank), jnp.float32)
      self.markov_bias(state, jnp.zeros((B,), jnp.int32), h_BRD[:, 0])
    if self.cfg.confidence_head:
      self.confidence_head(jnp.zeros((B, 1, self.cfg.confidence_head), h_BRD.dtype))
    return h_BRD


def single_block_rows(start_B, b: int) -> Rows:
  """Rows of one block per sequence anchored at `start`: positions start .. start+b-1."""
  B = start_B.shape[0]
  offset_Bb = jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32), (B, b))
  anchor_Bb = jnp.broadcast_to(start_B[:, None], (B, b))
  return Rows(anchor_Bb + offset_Bb, anchor_Bb, jnp.zeros_like(offset_Bb), offset_Bb)


def init_variables(cfg: BlockConfig, key, dtype=jnp.float32, target_hidden: int | None = None):
  """Random draft variables {"params": ...}; the conv starts as the identity (see DynamicConv)."""
  # Only what shapes the parameters keys the compile (windows, tap ids, mask id do not).
  shape_only = cfg.replace(
    target_layer_ids=tuple(range(len(cfg.target_layer_ids))),
    block_size=2,
    mask_token_id=0,
    windows=(),
    num_target_layers=None,
    causal=(),
    embed_scale=1.0,
    logit_scale=1.0,
    logit_softcap=0.0,
  )
  return _init_variables(shape_only, key, jnp.dtype(dtype), target_hidden or cfg.hidden_size)


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _init_variables(cfg: BlockConfig, key, dtype, target_hidden: int):
  D, b = cfg.hidden_size, cfg.block_size
  taps = jnp.zeros((1, b, len(cfg.target_layer_ids) * target_hidden), dtype)
  rows = single_block_rows(jnp.full((1,), b, jnp.int32), b)
  variables = BlockDraft(cfg).init(key, taps, jnp.zeros((1, b, D), dtype), rows, method="init_all")

  def zero_projection(path, p):
    names = [getattr(k, "key", "") for k in path]
    return jnp.zeros_like(p) if "kernel_projection" in names else p

  variables = jax.tree_util.tree_map_with_path(zero_projection, variables)
  return jax.tree.map(lambda p: p.astype(dtype), variables)
