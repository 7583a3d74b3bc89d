"""Drafters saved by the reference packages themselves (speculators 0.9.0, dflash 0.1.0, specforge
0.2.0; made by tests/fixtures/published/make_fixtures.py) load in specdec and give the packages'
own outputs: draft logits and drafts after a fixed context, for every option the fixtures turn on,
and greedy identity through `generate`. Also: specdec's speculators-format save, of those and of
drafters trained here, reloads in the speculators package (recorded in meta.json by the fixture
script) and here."""

import dataclasses
import functools
import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.checkpoint.safetensors_io import CheckpointError, read_tensors
from specdec.drafters.base import Context
from specdec.drafters.block_io import load_block
from specdec.drafters.block_model import single_block_rows
from specdec.drafters.eagle3 import load_eagle3
from specdec.drafters.mtp import load_mtp
from specdec.model import Model
from specdec.models.transformer import ForwardOut, KVCache
from specdec.ops.sampling import Sampling
from tests.helpers import tiny_config

HERE = "tests/fixtures/published"
REF = dict(np.load(os.path.join(HERE, "reference.npz")))
META = json.load(open(os.path.join(HERE, "meta.json")))
BLOCK_CASES = [
  "spec_dflash_causal_reduced",
  "spec_dflash_noncausal",
  "spec_dflash2",
  "spec_dspark_rnn",
  "spec_dspark_gated_reduced",
  "zlab_dflash_default",
  "zlab_dflash_is_causal",
  "zlab_dflash2",
]
EAGLE3_CASES = ["spec_eagle3_llama", "spec_eagle3_qwen3"]
# float32 both sides; the packages run torch eager, we run XLA on the CPU
ATOL, RTOL = 2e-4, 1e-4


def ref(case, name):
  return REF[f"{case}/{name}"]


@functools.cache
def target_for(case: str, num_layers: int) -> Model:
  """A tiny target whose embedding and LM head are the ones the package's drafter was given."""
  m = Model.random(tiny_config(num_hidden_layers=num_layers), seed=0, scale=10.0)
  p = dict(m.params["params"])
  p["embed"] = {"embedding": jnp.asarray(ref(case, "embed"))}
  p["lm_head"] = {"kernel": jnp.asarray(ref(case, "lm_head").T)}
  return dataclasses.replace(m, params={"params": p})


def _finite_close(ours, theirs):
  ours, theirs = np.asarray(ours), np.asarray(theirs)
  np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(theirs))
  keep = np.isfinite(theirs)
  np.testing.assert_allclose(ours[keep], theirs[keep], atol=ATOL, rtol=RTOL)


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _block_run(d, params, taps_BTX, anchor, n, S):
  """Context taps at positions 0..n-1, one proposal anchored at position n: (drafts, the block's
  final hidden [b, D], its draft logits [b-1, V])."""
  b = d.cfg.block_size
  D = d.target.config.hidden_size
  taps = tuple(taps_BTX[..., i * D : (i + 1) * D] for i in range(len(d.taps)))
  out = ForwardOut(None, KVCache.zeros(d.target.config, 1, S, d.target.dtype), taps, None)
  st = d.init(params, jnp.zeros((1, n), jnp.int32), jnp.array([n]), out)
  ctx = Context(jnp.zeros((1, S), jnp.int32).at[0, n].set(anchor), jnp.array([n + 1]))
  P = d.cfg.drafts_per_forward
  draft, _, _ = d.propose(params, st, ctx, P, Sampling(), jax.random.key(0))
  tok = jnp.concatenate([anchor[None, None], jnp.full((1, b - 1), d.cfg.mask_token_id)], 1)
  x = d._shared(params, tok, "embed_tokens") * d.cfg.embed_scale
  rows = single_block_rows(jnp.array([n]), b)
  h, _ = d.module.apply({"params": params["draft"]}, x, rows, st.k, st.v)
  if d.cfg.markov:  # each row's bias reads the previous row's draft
    _, logits = d._markov_walk(params, h, anchor[None], Sampling(), jax.random.key(0))
  else:
    logits = d.draft_logits(params, h if d.cfg.sample_from_anchor else h[:, 1:])
  return draft[0], h[0], logits[0]


def _check_block(d, case):
  taps = ref(case, "taps")
  draft, h, logits = _block_run(
    d, d.params, jnp.asarray(taps)[None], jnp.int32(ref(case, "anchor")), taps.shape[0], 32
  )
  np.testing.assert_allclose(h, ref(case, "hidden"), atol=ATOL, rtol=RTOL)
  _finite_close(logits, ref(case, "logits"))
  assert np.asarray(draft).tolist() == ref(case, "drafts").tolist()


@pytest.mark.parametrize("case", BLOCK_CASES)
def test_block_drafter_matches_its_package(case):
  d = load_block(os.path.join(HERE, case), target_for(case, 2))
  opts = META["cases"][case]
  if case.startswith("spec_"):
    assert d.cfg.target_layer_ids == (0, 1)  # speculators ids count from the embedding output
    assert d.cfg.is_causal(0) == (not opts["non_causal"]) and not d.cfg.is_causal(1)
    assert d.cfg.draft_vocab_size == (40 if opts["reduced"] else 0)
    assert d.cfg.selector == d.cfg.conv == opts["v2"]
    assert d.cfg.markov_rank == opts.get("markov_rank", 0)
    assert d.cfg.markov_head_type == opts.get("markov_head_type", "vanilla")
    assert d.cfg.sample_from_anchor == opts.get("sample_from_anchor", "markov_rank" in opts)
  if case == "zlab_dflash_default":  # no is_causal: the sliding layer is causal, the full is not
    assert d.cfg.causal == (True, False) and d.cfg.windows == (4, None)
    assert (d.cfg.embed_scale, d.cfg.logit_scale, d.cfg.logit_softcap) == (1.5, 0.7, 3.0)
  if case == "zlab_dflash_is_causal":
    assert d.cfg.causal == (True, True) and d.cfg.windows == ()
  _check_block(d, case)


def _eagle3_depth_logits(d, case, depth=3):
  """Depth 0: teacher-forced pairs; depth s: the chain from origin o, as speculators' TTT rows."""
  taps, tokens = ref(case, "taps"), ref(case, "tokens")
  T = tokens.shape[0]
  raw = jnp.asarray(np.concatenate([[0], tokens[:-1]]))[None]  # pair p holds raw[p + 1]
  h = d.module.apply(d.weights["head"], jnp.asarray(taps)[None], method="fuse")
  out, cache = d.teacher_forced(d.weights, h, raw)
  outs = [out[:, : T - 1]]  # the last pair's token is padding here
  origins = jnp.arange(T - depth)[None]
  outs += [o for o in d.chained(d.weights, out, cache, raw, origins, depth)]
  return [d.logits(d.weights, o)[0] for o in outs]


@pytest.mark.parametrize("case", EAGLE3_CASES)
def test_eagle3_matches_speculators(case):
  d = load_eagle3(os.path.join(HERE, case), target_for(case, 3))
  opts = META["cases"][case]
  assert d.taps == (0, 1, 2)
  for flag in ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual"):
    assert getattr(d.spec, flag) == opts.get(flag, False), flag
  assert d.spec.head.qk_norm == (opts["model_type"] == "qwen3")
  for j, ours in enumerate(_eagle3_depth_logits(d, case)):
    theirs = ref(case, f"logits_{j}")[: ours.shape[0]]
    _finite_close(ours, theirs)


def test_legacy_eagle3_matches_specforge():
  """SpecForge's SGLang export (bfloat16 weights, no embedding: the target's) against SpecForge's
  own training-time-test forward of the same export in float32, every depth; drafts are the
  argmax over the draft vocabulary. Both sides compute in float32 on the same bfloat16 weights,
  so the tolerance is the float32 one (ATOL, RTOL)."""
  case = "specforge_eagle3"
  path = os.path.join(HERE, case)
  assert "embed_tokens.weight" not in read_tensors(os.path.join(path, "model.safetensors"))
  d = load_eagle3(path, target_for(case, 3))
  assert d.taps == (0, 1, 2)  # eagle_config ids [0, 1, 2] count layer outputs
  assert d.spec.draft_vocab_size == 40 and not d.spec.head.qk_norm
  assert not (d.spec.norm_before_fc or d.spec.fc_norm or d.spec.norm_output)
  for j, ours in enumerate(_eagle3_depth_logits(d, case)):
    theirs = ref(case, f"logits_{j}")[: ours.shape[0]]
    _finite_close(ours, theirs)
    assert np.asarray(ours).argmax(-1).tolist() == theirs.argmax(-1).tolist(), j


def test_mtp_matches_speculators():
  case = "spec_mtp"
  target = target_for(case, 2)
  d = load_mtp(os.path.join(HERE, case), target)
  assert d.spec.layout == "speculators" and d.taps == (1,)  # fed the last layer's output
  hidden, tokens = jnp.asarray(ref(case, "hidden"))[None], jnp.asarray(ref(case, "tokens"))[None]
  out, _ = d.teacher_forced(d.weights, hidden, tokens)
  theirs = ref(case, "logits_0")
  np.testing.assert_allclose(
    d.logits(d.weights, out)[0, : theirs.shape[0]], theirs, atol=ATOL, rtol=RTOL
  )


PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9, 3, 9, 3, 9]]


@pytest.mark.parametrize(
  "case,loader,layers,k",
  [
    ("spec_dflash_causal_reduced", load_block, 2, 3),
    ("zlab_dflash2", load_block, 2, 3),
    ("spec_dspark_rnn", load_block, 2, 8),  # b = 6 drafts per forward: chained past one block
    ("spec_eagle3_llama", load_eagle3, 3, 3),
    ("specforge_eagle3", load_eagle3, 3, 3),
    ("spec_mtp", load_mtp, 2, 3),
  ],
)
def test_greedy_identity_through_generate(case, loader, layers, k):
  target = target_for(case, layers)
  base = specdec.generate(target, PROMPTS, max_new_tokens=12).tokens
  d = loader(os.path.join(HERE, case), target)
  out = specdec.generate(target, PROMPTS, max_new_tokens=12, drafter=d, k=k)
  assert out.tokens == base


# --- specdec writes the speculators format -----------------------------------------------------


def layers_for(case: str) -> int:
  return 3 if "eagle3" in case else 2


def saved(case, root) -> str:
  """Loads a package fixture and writes it again under root/case with specdec.save (the
  speculators format)."""
  out = os.path.join(root, case)
  target = target_for(case, layers_for(case))
  specdec.save(out, specdec.load_drafter(os.path.join(HERE, case), target))
  return out


@pytest.mark.parametrize("case", sorted(META["cases"]))
def test_load_drafter_tells_the_layouts_apart(case):
  d = specdec.load_drafter(os.path.join(HERE, case), target_for(case, layers_for(case)))
  want = {"dflash": "block", "dspark": "block", "eagle3": "eagle3", "mtp": "mtp"}
  assert d.name == next(v for k, v in want.items() if k in case)


ROUNDTRIP = sorted(META.get("roundtrip", {}))


@pytest.mark.parametrize("case", ROUNDTRIP)
def test_speculators_loaded_what_specdecsaved(case, tmp_path):
  """meta.json (written by the fixture script's roundtrip stage) says the speculators package
  loaded the checkpoint specdec wrote and drafted from it exactly what it drafts from its own
  save; the committed copy is what specdec.save writes today."""
  rec = META["roundtrip"][case]
  assert rec["loaded_by"].startswith("speculators ")
  kinds = {
    "dflash": "DFlashDraftModel",
    "dflash2": "DFlash2DraftModel",
    "dspark": "DSparkDraftModel",
  }
  kinds.update(eagle3="Eagle3DraftModel", mtp="MTPDraftModel")
  assert rec["class"] == kinds[case.split("_")[1]]
  diffs = rec["max_abs_diff_vs_package_save"]
  assert diffs and all(isinstance(v, float) and v <= 1e-6 for v in diffs.values()), diffs
  out = saved(case, tmp_path)
  committed = os.path.join(HERE, "roundtrip", case)
  ours, theirs = (
    read_tensors(os.path.join(out, "model.safetensors")),
    read_tensors(os.path.join(committed, "model.safetensors")),
  )
  assert sorted(ours) == sorted(theirs)
  for k in ours:
    np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)
  with (
    open(os.path.join(out, "config.json")) as f,
    open(os.path.join(committed, "config.json")) as g,
  ):
    assert json.load(f) == json.load(g)


@pytest.mark.parametrize("case", ["spec_dflash_causal_reduced", "spec_eagle3_llama", "spec_mtp"])
def test_speculators_save_reloads_here(case, tmp_path):
  out = saved(case, tmp_path)
  if case.startswith("spec_dflash"):
    _check_block(load_block(out, target_for(case, 2)), case)
  elif case.startswith("spec_eagle3"):
    d = load_eagle3(out, target_for(case, 3))
    for j, ours in enumerate(_eagle3_depth_logits(d, case)):
      _finite_close(ours, ref(case, f"logits_{j}")[: ours.shape[0]])
  else:
    assert load_mtp(out, target_for(case, 2)).spec.layout == "speculators"


# --- drafters trained here, read by the speculators package ------------------------------------

TRAINED = sorted(META.get("trained", {}))


def _layer_matches(layers, rec):
  assert layers.num_layers == rec["num_hidden_layers"]
  assert layers.intermediate_size == rec["intermediate_size"]
  assert layers.rope_theta == rec["rope_parameters"]["rope_theta"]
  assert layers.qk_norm == (rec["model_type"] == "qwen3")


@pytest.mark.parametrize("case", TRAINED)
def test_a_drafter_trained_here_reloads_as_speculators_read_it(case):
  """specdec_eagle3 / specdec_dflash: trained by specdec's own trainer (write_trained.py: the zoo
  recipes, shrunk) and exported in the speculators format. meta.json records what the speculators
  package read from them (the fixture script's roundtrip stage); specdec's reload agrees on every
  config field, on every tensor (the package took them all, unchanged) and drafts what the
  package drafts (its own forward's logits, float32 tolerance ATOL / RTOL)."""
  rec, path = META["trained"][case], os.path.join(HERE, case)
  assert rec["loaded_by"].startswith("speculators ")
  assert rec["not_taken"] == [] and rec["max_abs_diff_vs_file"] == 0.0
  saved = read_tensors(os.path.join(path, "model.safetensors"))
  assert {k: list(v.shape) for k, v in saved.items()} == {k: rec["tensors"][k] for k in saved}
  with open(os.path.join(path, "training.json")) as f:
    training = json.load(f)
  assert training["config"]["export_format"] == "speculators"
  losses = [h["loss"] for h in training["history"]["train"]]
  assert losses[-1] < losses[0]
  cfg = rec["config"]
  d = specdec.load_drafter(path, target_for(case, 3))
  if "eagle3" in case:
    assert rec["class"] == "Eagle3DraftModel" and d.name == "eagle3"
    assert "embed_tokens.weight" in saved  # the package would not take the verifier's
    assert d.taps == tuple(i - 1 for i in cfg["eagle_aux_hidden_state_layer_ids"])
    assert d.spec.draft_vocab_size == cfg["draft_vocab_size"] < 64
    for flag in ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual"):
      assert getattr(d.spec, flag) == cfg[flag], flag
    _layer_matches(d.spec.head, rec["layer_config"])
    for j, ours in enumerate(_eagle3_depth_logits(d, case)):
      _finite_close(ours, ref(case, f"logits_{j}")[: ours.shape[0]])
  else:
    assert rec["class"] == "DFlashDraftModel" and d.name == "block"
    assert d.cfg.target_layer_ids == tuple(i - 1 for i in cfg["aux_hidden_state_layer_ids"])
    assert (d.cfg.block_size, d.cfg.mask_token_id) == (cfg["block_size"], cfg["mask_token_id"])
    assert d.cfg.draft_vocab_size == (0 if cfg["draft_vocab_size"] == 64 else 1)
    assert d.cfg.sample_from_anchor == cfg["sample_from_anchor"]
    types = rec["layer_config"]["layer_types"]
    non_causal = cfg["sliding_window_non_causal"]
    want = [t == "sliding_attention" and not non_causal for t in types]
    assert [d.cfg.is_causal(i) for i in range(len(types))] == want
    _layer_matches(d.cfg.layers, rec["layer_config"])
    _check_block(d, case)


# --- options refused by name ----------------------------------------------------------------


def _edit(case, tmp_path, fn):
  out = tmp_path / case
  shutil.copytree(os.path.join(HERE, case), out)
  with open(out / "config.json") as f:
    d = json.load(f)
  fn(d)
  with open(out / "config.json", "w") as f:
    json.dump(d, f)
  return str(out)


REFUSED = {
  "peagle": (
    "spec_dflash_noncausal",
    lambda d: d.update(speculators_model_type="peagle"),
    "speculators_model_type 'peagle': parallel EAGLE drafters are not implemented",
  ),
  "dspark head type": (
    "spec_dspark_rnn",
    lambda d: d.update(markov_head_type="lstm"),
    "markov_head_type 'lstm' is not one of vanilla, gated, rnn",
  ),
  "aux id 0": (
    "spec_dflash_noncausal",
    lambda d: d.update(aux_hidden_state_layer_ids=[0, 1]),
    "aux_hidden_state_layer_ids [0, 1] has id(s) [0] outside",
  ),
  "duplicate aux ids": (
    "spec_dflash_noncausal",
    lambda d: d.update(aux_hidden_state_layer_ids=[2, 2]),
    "aux_hidden_state_layer_ids [2, 2] repeats layer id(s) [2]",
  ),
  "unknown option": (
    "spec_dflash_noncausal",
    lambda d: d.update(anchor_temperature=0.5),
    "speculators dflash option(s) ['anchor_temperature'] are not implemented",
  ),
  "unknown dflash_config option": (
    "zlab_dflash_default",
    lambda d: d["dflash_config"].update(noise_schedule="cosine"),
    "dflash_config option(s) ['noise_schedule'] are not implemented",
  ),
  "missing mask_token_id": (
    "spec_dflash_noncausal",
    lambda d: d.pop("mask_token_id"),
    "missing mask_token_id",
  ),
  "target_hidden_size": (
    "spec_dflash_noncausal",
    lambda d: d.update(target_hidden_size=64),
    "target_hidden_size 64",
  ),
  "eagle3 two layers": (
    "spec_eagle3_llama",
    lambda d: d["transformer_layer_config"].update(num_hidden_layers=2),
    "transformer_layer_config.num_hidden_layers=2",
  ),
  "eagle3 both norms": (
    "spec_eagle3_llama",
    lambda d: d.update(fc_norm=True),
    "norm_before_fc and fc_norm are mutually exclusive",
  ),
  "eagle3 aux out of range": (
    "spec_eagle3_llama",
    lambda d: d.update(eagle_aux_hidden_state_layer_ids=[1, 2, 4]),
    "has id(s) [4] outside [1, 3]",
  ),
  "mtp other family": (
    "spec_mtp",
    lambda d: d["transformer_layer_config"].update(model_type="llama"),
    "transformer_layer_config.model_type 'llama'",
  ),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_unsupported_options_are_refused_by_name(name, tmp_path):
  case, fn, message = REFUSED[name]
  path = _edit(case, tmp_path, fn)
  loader = {"spec_d": load_block, "zlab_d": load_block, "spec_e": load_eagle3}.get(
    case[:6], load_mtp
  )
  with pytest.raises(CheckpointError, match=re.escape(message)):
    loader(path, target_for(case, 3 if "eagle3" in case else 2))


@pytest.mark.parametrize("case", ["spec_dspark_gated_reduced", "spec_dflash_causal_reduced"])
def test_sampled_drafts_are_draws_from_q(case):
  """Under sampling every draft has q > 0, q sums to 1 and is 0 outside a reduced vocabulary
  (DSpark: each row's q is the one its own Markov bias gave)."""
  d = load_block(os.path.join(HERE, case), target_for(case, 2))
  taps = ref(case, "taps")
  n, S, P = taps.shape[0], 32, d.cfg.drafts_per_forward
  D = d.target.config.hidden_size
  parts = tuple(jnp.asarray(taps)[None, :, i * D : (i + 1) * D] for i in range(len(d.taps)))
  out = ForwardOut(None, KVCache.zeros(d.target.config, 1, S, d.target.dtype), parts, None)
  st = d.init(d.params, jnp.zeros((1, n), jnp.int32), jnp.array([n]), out)
  anchor = int(ref(case, "anchor"))
  ctx = Context(jnp.zeros((1, S), jnp.int32).at[0, n].set(anchor), jnp.array([n + 1]))
  propose = jax.jit(lambda params, key: d.propose(params, st, ctx, P, Sampling(0.8), key)[:2])
  for seed in range(3):
    draft, q = propose(d.params, jax.random.key(seed))
    np.testing.assert_allclose(q.sum(-1), 1.0, atol=1e-5)
    assert bool(jnp.all(jnp.take_along_axis(q, draft[..., None], -1) > 0))
    outside = np.setdiff1d(np.arange(q.shape[-1]), np.asarray(d.draft_ids))
    assert float(jnp.abs(q[..., outside]).max()) == 0.0
