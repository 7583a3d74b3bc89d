"""The block drafter (DFlash / DFlash2): attention masks, parity with an independent reference of
the published layout, the greedy identity gate (chained past the block), the incremental context
cache, a drafter trained here that actually gets accepted, and checkpoint round trips / errors."""

import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import specdec
from specdec.checkpoint.safetensors_io import read_tensors, write_tensors
from specdec.decoding.generate import cache_slots, prompt_bucket
from specdec.decoding.step import StepConfig, decode_chunk, prefill
from specdec.drafters.base import Context
from specdec.drafters.block import block
from specdec.drafters.block_config import from_hf_dict, make_config
from specdec.drafters.block_io import load_block, save_block
from specdec.drafters.block_model import single_block_rows
from specdec.model import forward
from specdec.models.transformer import ForwardOut, KVCache
from specdec.ops.sampling import Sampling
from specdec.training.block import block_rows, init_params, make_loss
from specdec.training.loop import fit
from tests.fixtures.dflash import reference
from tests.helpers import tiny_model

FIXTURES = "tests/fixtures/dflash"
PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9, 3], [1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 4]]
MAX_NEW = 24  # short enough that generate only compiles its 1-step chunk
GREEDY = Sampling()
DFLASH2_KW = dict(conv=True, selector=True, selector_top_k=4, selector_rank=8)
DSPARK_KW = dict(
  sample_from_anchor=True, markov_rank=8, markov_head_type="rnn", confidence_head=True
)


@pytest.fixture(scope="module")
def target():
  return tiny_model(seed=0)


@pytest.fixture(scope="module")
def drafters(target):
  kw = dict(num_layers=1, block_size=8, target_layer_ids=(0, 1))
  return {"dflash": block(target, **kw), "dflash2": block(target, seed=1, **kw, **DFLASH2_KW)}


@pytest.fixture(scope="module")
def baseline(target):
  return {B: specdec.generate(target, PROMPTS[:B], max_new_tokens=MAX_NEW).tokens for B in (1, 3)}


# --- masks --------------------------------------------------------------------------------------


_hidden = jax.jit(
  lambda d, params, x, rows, ck, cv: d.module.apply({"params": params["draft"]}, x, rows, ck, cv)[
    0
  ],
  static_argnums=0,
)


def _ctx(d, S, seed):
  c = d.cfg.layers
  keys = jax.random.split(jax.random.key(seed), 2 * c.num_layers)
  shape = (1, S, c.num_kv_heads, c.head_dim)
  ks = tuple(jax.random.normal(keys[i], shape) for i in range(c.num_layers))
  vs = tuple(jax.random.normal(keys[c.num_layers + i], shape) for i in range(c.num_layers))
  return ks, vs


def _bump(kv, slots):
  return tuple(x.at[:, slots].add(3.0) for x in kv)


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_block_sees_committed_context_and_its_own_rows_only(drafters, kind):
  d = drafters[kind]
  b, a, S = d.cfg.block_size, 10, 24
  ck, cv = _ctx(d, S, 0)
  x = jax.random.normal(jax.random.key(1), (1, b, d.cfg.hidden_size))
  rows = single_block_rows(jnp.array([a]), b)
  h = _hidden(d, d.params, x, rows, ck, cv)
  # Slots at and after the anchor (stale drafts, future positions) are invisible, exactly.
  assert jnp.array_equal(
    h, _hidden(d, d.params, x, rows, _bump(ck, slice(a, S)), _bump(cv, slice(a, S)))
  )
  assert not jnp.allclose(h, _hidden(d, d.params, x, rows, _bump(ck, a - 1), cv))
  # Bidirectional inside the block: the last row moves the first predicted row and vice versa.
  h2 = _hidden(d, d.params, x.at[:, b - 1].add(1.0), rows, ck, cv)
  assert not jnp.allclose(h[:, 1], h2[:, 1])
  h3 = _hidden(d, d.params, x.at[:, 1].add(1.0), rows, ck, cv)
  assert not jnp.allclose(h[:, b - 1], h3[:, b - 1])


def test_sliding_window_bounds_the_context(drafters, target):
  d = drafters["dflash2"]
  d = block(target, d.draft_params, d.cfg, sliding_window=3)
  b, a, S = d.cfg.block_size, 10, 24
  ck, cv = _ctx(d, S, 2)
  x = jax.random.normal(jax.random.key(3), (1, b, d.cfg.hidden_size))
  rows = single_block_rows(jnp.array([a]), b)
  h = _hidden(d, d.params, x, rows, ck, cv)
  # Row q sees slot s iff q - s < 3: nothing at or before a - 3, slot a - 2 through row 0.
  assert jnp.array_equal(h, _hidden(d, d.params, x, rows, _bump(ck, slice(0, a - 2)), cv))
  assert not jnp.allclose(h, _hidden(d, d.params, x, rows, _bump(ck, a - 2), cv))


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_training_blocks_are_independent_and_match_inference(drafters, kind):
  d = drafters[kind]
  b, S, D = d.cfg.block_size, 24, d.cfg.hidden_size
  ck, cv = _ctx(d, S, 4)
  anchors = jnp.array([[5, 12]])
  x = jax.random.normal(jax.random.key(5), (1, 2 * b, D))
  h = _hidden(d, d.params, x, block_rows(anchors, b), ck, cv)
  h_other = _hidden(d, d.params, x.at[:, b:].add(1.0), block_rows(anchors, b), ck, cv)
  assert jnp.array_equal(h[:, :b], h_other[:, :b])  # no attention or conv tap across blocks
  for i, a in enumerate((5, 12)):
    one = _hidden(
      d, d.params, x[:, i * b : (i + 1) * b], single_block_rows(jnp.array([a]), b), ck, cv
    )
    np.testing.assert_allclose(h[:, i * b : (i + 1) * b], one, atol=2e-5)


# --- the published layouts, against an independent reference --------------------------------


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6))
def _layout_run(d, params, taps, anchor, n, S, sampling=GREEDY):
  """init from prompt taps, propose 7 from `anchor`, and the block's final hidden states."""
  prefill_out = ForwardOut(None, KVCache.zeros(d.target.config, 1, S, d.target.dtype), taps, None)
  st = d.init(params, jnp.zeros((1, n), jnp.int32), jnp.array([n]), prefill_out)
  ctx = Context(jnp.zeros((1, S), jnp.int32).at[0, n].set(anchor), jnp.array([n + 1]))
  draft, q, _ = d.propose(params, st, ctx, 7, sampling, jax.random.key(0))
  b = d.cfg.block_size
  tok = jnp.concatenate([anchor[None, None], jnp.full((1, b - 1), d.cfg.mask_token_id)], 1)
  x = d._shared(params, tok, "embed_tokens")
  h = d.module.apply(
    {"params": params["draft"]}, x, single_block_rows(jnp.array([n]), b), st.k, st.v
  )
  return draft, q, h[0]


@pytest.mark.parametrize("name", ["dflash", "dflash2"])
def test_published_layout_matches_reference(target, name):
  path = os.path.join(FIXTURES, name)
  with open(os.path.join(path, "config.json")) as f:
    cfg = json.load(f)
  d = load_block(path, target)
  n, S, anchor = 11, 32, 17
  rng = np.random.default_rng(0)
  taps = [rng.standard_normal((1, n, 48)).astype(np.float32) for _ in d.cfg.target_layer_ids]
  draft, q, h = _layout_run(d, d.params, tuple(map(jnp.asarray, taps)), jnp.int32(anchor), n, S)
  p = target.params["params"]
  h_ref, draft_ref = reference.forward(
    read_tensors(os.path.join(path, "model.safetensors")),
    cfg,
    np.concatenate(taps, -1)[0],
    anchor,
    n,
    p["embed"]["embedding"],
    p["lm_head"]["kernel"],
  )
  np.testing.assert_allclose(h[0], h_ref, atol=2e-4, rtol=1e-4)
  assert np.asarray(draft)[0].tolist() == draft_ref.tolist()
  assert q is None  # greedy drafting returns no q


@pytest.mark.parametrize("name", ["dflash", "dflash2"])
def test_full_q_drafts_are_draws_from_q(target, name):
  d = load_block(os.path.join(FIXTURES, name), target)
  taps = tuple(jnp.ones((1, 9, 48)) * (i + 1) for i in range(len(d.taps)))
  s = Sampling(temperature=0.8)
  draft, q, _ = _layout_run(d, d.params, taps, jnp.int32(17), 9, 32, s)
  q_at_draft = jnp.take_along_axis(q, draft[..., None], -1)
  np.testing.assert_allclose(q.sum(-1), 1.0, atol=1e-5)
  assert bool(jnp.all(q_at_draft > 0))
  if d.cfg.selector:  # the walk draws among each position's top-k candidates only
    assert bool(jnp.all(jnp.sum(q > 0, -1) <= d.cfg.selector_top_k))


# --- the greedy gate ----------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 4, 8, 12])
@pytest.mark.parametrize("B", [1, 3])
def test_greedy_is_token_identical_to_baseline(target, baseline, drafters, k, B):
  out = specdec.generate(
    target, PROMPTS[:B], max_new_tokens=MAX_NEW, drafter=drafters["dflash"], k=k
  )
  assert out.tokens == baseline[B]
  s = out.stats
  assert 1.0 <= s["tau"] <= k + 1
  assert sum(s["rows"]["proposed"]) == k * sum(s["rows"]["steps"])


@pytest.mark.parametrize("k", [4, 12])
def test_greedy_identity_dflash2(target, baseline, drafters, k):
  out = specdec.generate(target, PROMPTS, max_new_tokens=MAX_NEW, drafter=drafters["dflash2"], k=k)
  assert out.tokens == baseline[3]


def _decode(target, d, prompts, k, n_steps):
  """The state after prefill + n_steps steps, built exactly as `generate` builds it (so its
  compiled prefill and step are reused)."""
  B, longest = len(prompts), max(map(len, prompts))
  bucket = prompt_bucket(longest)
  prompt_BT = np.zeros((B, bucket), np.int32)
  for i, p in enumerate(prompts):
    prompt_BT[i, : len(p)] = p
  sc = StepConfig(target.config, target.dtype, d, k, Sampling(), "greedy", ())
  st = prefill(
    target.params,
    d.params,
    jnp.asarray(prompt_BT),
    jnp.asarray([len(p) for p in prompts], jnp.int32),
    jnp.full((B,), MAX_NEW, jnp.int32),
    jax.random.key(0),
    sc,
    cache_slots(bucket, MAX_NEW, k),
  )
  for _ in range(n_steps):
    st = decode_chunk(target.params, d.params, st, sc, 1)
  return st


_context = jax.jit(lambda d, params, taps, pos: d._context(params, taps, pos), static_argnums=0)


def _assert_context_cache_is_exact(target, d, st):
  """Every readable context slot equals the context computed from scratch (one causal target
  forward over the committed tokens): commits wrote the right positions, rollback lost nothing."""
  full = forward(target.params, st.tokens, target.config, target.dtype, d.taps)
  S = st.tokens.shape[1]
  pos = jnp.broadcast_to(jnp.arange(S), st.tokens.shape)
  ks, vs = _context(d, d.params, full.taps, pos)
  for b, n in enumerate(np.asarray(st.lengths) - 1):
    for mine, ref in zip(st.draft.k + st.draft.v, ks + vs, strict=True):
      np.testing.assert_allclose(mine[b, :n], ref[b, :n], atol=1e-4)


def test_context_cache_matches_a_full_forward(target, drafters):
  d = drafters["dflash2"]
  st = _decode(target, d, PROMPTS, 12, 6)
  _assert_context_cache_is_exact(target, d, st)


# --- a drafter trained here ----------------------------------------------------------------------

STEPS = 150
V_USED = 62  # ids 1..61 in the corpus; 63 is the mask token


def _alternation(rng, n, T):
  """Each sequence alternates two random tokens a b a b ...: the target must copy from two back,
  and a drafter must read the context to know the token before its anchor."""
  a = rng.integers(1, V_USED, n)
  b = (a + rng.integers(1, V_USED - 1, n) - 1) % (V_USED - 1) + 1
  return np.where(np.arange(T) % 2 == 0, a[:, None], b[:, None]).astype(np.int32)


def _joint_loss(target, cfgs):
  """Target and drafters in ONE loss, so one compile trains them all: the target learns the corpus
  by next-token CE and each drafter distils from the current target (frozen for its own loss)."""
  losses = [make_loss(target, c, anchors=8) for c in cfgs]

  def loss_fn(params, frozen, batch, key):
    logits = forward(params["target"], batch[:, :-1], target.config, target.dtype).logits
    ce = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, batch[:, 1:, None], -1)[..., 0]
    teacher = {"target": jax.lax.stop_gradient(params["target"])}
    loss, metrics = ce.mean(), {"target_ce": ce.mean()}
    keys = jax.random.split(key, len(cfgs))
    for i, (fn, p, k) in enumerate(zip(losses, params["drafts"], keys, strict=True)):
      l, m = fn(p, teacher, batch, k)
      loss = loss + l
      metrics.update({f"{name}_{i}": v for name, v in m.items()})
    return loss, metrics

  return loss_fn


@pytest.mark.slow
def test_trained_drafter_is_accepted(target):
  kw = dict(num_layers=1, block_size=8, target_layer_ids=(0, 1))
  cfgs = [
    make_config(target.config, **kw),
    make_config(target.config, **kw, **DFLASH2_KW),
    make_config(target.config, **kw, **DSPARK_KW),
  ]
  # Start the target from the same random weights at unit scale (tiny_model multiplies by 10);
  # fresh buffers, because fit donates what it trains.
  unit = jax.tree.map(lambda p: p / 10 if p.ndim > 1 else jnp.array(p, copy=True), target.params)
  keys = jax.random.split(jax.random.key(0), len(cfgs))
  params = {
    "target": unit,
    "drafts": [init_params(target, c, k) for c, k in zip(cfgs, keys, strict=True)],
  }
  rng = np.random.default_rng(0)
  batches = (_alternation(rng, 32, 24) for _ in range(STEPS))
  params, history = fit(
    _joint_loss(target, cfgs),
    params,
    batches,
    optimizer=optax.adam(5e-3),
    steps=STEPS,
    log_every=25,
    progress=False,
  )
  last = history["train"][-1]
  assert all(last[f"tau_block_{i}"] > 3 for i in range(3)), last
  # DSpark's confidence head tracks its rows' acceptance probability (1 - TV / 2) better than
  # the batch's mean acceptance would, while the target it is measured against keeps training.
  err, const = last["confidence_abs_error_2"], last["confidence_abs_error_const_2"]
  assert err < 0.95 * const and last["tau_probabilistic_2"] > 2.5, last
  trained = specdec.Model(target.config, params["target"], None, target.dtype)
  prompts = [
    _alternation(np.random.default_rng(i), 1, n)[0].tolist() for i, n in enumerate((5, 8, 11, 6))
  ]
  want = specdec.generate(trained, prompts, max_new_tokens=MAX_NEW).tokens
  for cfg, p in zip(cfgs, params["drafts"], strict=True):
    d = block(trained, p, cfg)
    out = specdec.generate(trained, prompts, max_new_tokens=MAX_NEW, drafter=d, k=4)
    assert out.tokens == want
    assert out.stats["tau"] >= 1.5, out.stats["tau"]
    _assert_context_cache_is_exact(trained, d, _decode(trained, d, prompts, 4, 5))


# --- checkpoints ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dflash", "dflash2"])
def test_layout_round_trip_is_byte_exact(target, tmp_path, name):
  src = os.path.join(FIXTURES, name)
  d = load_block(src, target)
  save_block(str(tmp_path), d.cfg, d.draft_params, dtype=jnp.bfloat16)
  a = read_tensors(os.path.join(src, "model.safetensors"))
  b = read_tensors(os.path.join(tmp_path, "model.safetensors"))
  assert sorted(a) == sorted(b)
  for k in a:
    assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k
  assert load_block(str(tmp_path), target).cfg == d.cfg


def test_fresh_drafter_round_trip(target, tmp_path):
  cfg = make_config(
    target.config, num_layers=1, block_size=4, target_layer_ids=(1, 0), **DFLASH2_KW
  )
  cfg = cfg.replace(windows=(5,))
  params = init_params(target, cfg, jax.random.key(0))
  save_block(str(tmp_path), cfg, params)
  d = load_block(str(tmp_path), target)
  assert d.cfg == cfg
  jax.tree.map(np.testing.assert_array_equal, d.draft_params, params)
  with open(tmp_path / "config.json") as f:
    assert from_hf_dict(json.load(f)) == cfg


def test_tolerated_layout_variants(target, tmp_path):
  def variants(t):
    for book in ("predecessor", "successor"):  # some exports add ".weight" to the codebooks
      name = f"candidate_selector.{book}_codebook"
      t[name + ".weight"] = t.pop(name)
    t["embed_tokens.weight"] = np.zeros((64, 48), np.float32)  # the target's; ignored

  d = load_block(_broken(tmp_path, "dflash2", edit_tensors=variants), target)
  ref = load_block(os.path.join(FIXTURES, "dflash2"), target)
  jax.tree.map(np.testing.assert_array_equal, d.draft_params, ref.draft_params)


def _broken(tmp_path, name, edit_config=None, edit_tensors=None):
  dst = tmp_path / name
  shutil.copytree(os.path.join(FIXTURES, name), dst)
  if edit_config:
    with open(dst / "config.json") as f:
      c = json.load(f)
    edit_config(c)
    with open(dst / "config.json", "w") as f:
      json.dump(c, f)
  if edit_tensors:
    t = dict(read_tensors(str(dst / "model.safetensors")))
    edit_tensors(t)
    write_tensors(str(dst / "model.safetensors"), t)
  return str(dst)


def _set_taps(ids):
  return lambda c: c["dflash_config"].update(target_layer_ids=ids)


BAD = {
  "too few taps": ("dflash", _set_taps([1]), None, r"'fc\.weight'.*1 taps x target hidden 48"),
  "tap beyond the target": ("dflash", _set_taps([0, 2]), None, r"target_layer_ids \[2\]"),
  "hidden size": ("dflash", lambda c: c.update(hidden_size=64), None, "hidden_size 64.*48"),
  "missing conv": (
    "dflash2",
    None,
    lambda t: t.pop("layers.1.mlp_conv.base_kernel"),
    r"missing tensor 'layers\.1\.mlp_conv\.base_kernel'",
  ),
  "missing selector": (
    "dflash2",
    None,
    lambda t: t.pop("candidate_selector.successor_codebook"),
    "candidate_selector.successor_codebook",
  ),
  "misshapen": (
    "dflash",
    None,
    lambda t: t.update({"layers.0.self_attn.k_norm.weight": t["norm.weight"]}),
    r"'layers\.0\.self_attn\.k_norm\.weight' has shape \(48,\), expected \(16,\)",
  ),
  "unknown tensor": (
    "dflash",
    None,
    lambda t: t.update({"layers.0.extra.weight": t["norm.weight"]}),
    r"unexpected tensor 'layers\.0\.extra\.weight'",
  ),
  "dflash2 config keys": (
    "dflash2",
    lambda c: c["dflash_config"].pop("selector_rank"),
    None,
    r"dflash_config\.selector_rank",
  ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoints_name_the_problem(target, tmp_path, case):
  name, edit_config, edit_tensors, message = BAD[case]
  path = _broken(tmp_path, name, edit_config, edit_tensors)
  with pytest.raises(ValueError, match=message):
    load_block(path, target)
