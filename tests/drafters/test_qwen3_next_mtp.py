"""The Qwen3-Next MTP head shipped in its hybrid target's checkpoint (`mtp.*` tensors): parity with
the re-statement in tests/fixtures/hybrid/make_hybrid.py, greedy identity as a drafter on its
own target, bad heads named by tensor, and the head read from a Qwen3.5 vision-language wrapper."""

import functools
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.checkpoint.safetensors_io import CheckpointError, read_tensors
from specdec.drafters import heads
from specdec.drafters.mtp import MTP, tensor_names
from specdec.drafters.mtp import mtp as mtp_drafter
from specdec.model import forward
from tests.checkpoint.test_loader_errors import _edit_config, _edit_tensors

SOURCE = "tests/fixtures/hybrid/qwen3_next_mtp"


@pytest.fixture(scope="module")
def target():
  return specdec.load(SOURCE, dtype=jnp.float32)


@pytest.fixture(scope="module")
def drafter(target):
  return specdec.load_drafter(SOURCE, target)


@pytest.fixture(scope="module")
def ref():
  return np.load(os.path.join(SOURCE, "mtp_reference.npz"))


@functools.partial(jax.jit, static_argnames=("drafter", "config", "depth"))
def head_logits(target_params, params, tokens_BT, origins_BO, drafter, config, depth):
  """(teacher-forced logits of every pair, logits of the chains from origins_BO)."""
  h_BTD = drafter.features(params, forward(target_params, tokens_BT, config, drafter.dtype))
  out_BTD, cache = drafter.teacher_forced(params, h_BTD, tokens_BT)
  chain = drafter.chained(params, out_BTD, cache, tokens_BT, origins_BO, depth)
  return drafter.logits(params, out_BTD), jnp.stack([drafter.logits(params, c) for c in chain], 2)


def test_loads_the_routed_layer_from_the_targets_checkpoint(target, drafter):
  assert isinstance(drafter, MTP) and drafter.spec.layout == "qwen3_next"
  assert target.config.moe_layers == (True, True, False, True)
  layer = drafter.params["head"]["params"]["layer_0"]
  assert layer["mlp"]["experts"]["gate_proj"].shape == (8, 32, 24)
  assert layer["attn"]["q_proj"]["kernel"].shape == (32, 2 * 4 * 16)  # q and its output gate
  assert drafter.params["target"]["params"]["embed"] is target.params["params"]["embed"]


def test_draft_logits_match_the_reference(target, drafter, ref):
  ids_BT = jnp.asarray(ref["input_ids"])
  B, T = ids_BT.shape
  origins_BO = jnp.broadcast_to(jnp.asarray(ref["origins"]), (B, len(ref["origins"])))
  depth = ref["chain_logits"].shape[2] + 1
  tf, chain = head_logits(
    target.params, drafter.params, ids_BT, origins_BO, drafter, target.config, depth
  )
  assert tf.shape[1] - 1 == ref["mtp_logits"].shape[1] == T - 1
  assert np.abs(np.asarray(tf)[:, :-1] - ref["mtp_logits"]).max() <= 1e-4
  assert chain.shape == ref["chain_logits"].shape
  assert np.abs(np.asarray(chain) - ref["chain_logits"]).max() <= 1e-4


@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_identity_on_its_hybrid_target(target, drafter, ref, B, k):
  prompt = np.load(os.path.join(SOURCE, "reference.npz"))["prompt"][0]
  rows = [prompt.tolist(), ref["input_ids"][0, :9].tolist(), ref["input_ids"][1].tolist()]
  prompts = rows[:B]
  base = specdec.generate(target, prompts, max_new_tokens=20)
  out = specdec.generate(target, prompts, max_new_tokens=20, drafter=drafter, k=k)
  assert out.tokens == base.tokens
  assert out.stats["proposed"] > 0


def test_save_writes_the_head_it_loaded(tmp_path, target, drafter):
  specdec.save(str(tmp_path), drafter, format="native")
  written = read_tensors(f"{tmp_path}/model.safetensors")
  shipped = read_tensors(f"{SOURCE}/model.safetensors")
  assert set(written) == {n for n in shipped if n.startswith("mtp.")}  # experts one each
  again = specdec.load_drafter(str(tmp_path), target)
  for p, v in heads.flat_params(drafter.weights["head"]).items():
    np.testing.assert_array_equal(
      np.asarray(v), np.asarray(heads.flat_params(again.weights["head"])[p])
    )


@pytest.fixture
def ckpt(tmp_path):
  path = str(tmp_path / "m")
  shutil.copytree(SOURCE, path)
  return path


def _fails(path, target, *fragments):
  with pytest.raises(CheckpointError) as e:
    specdec.load_drafter(path, target)
  for frag in fragments:
    assert frag in str(e.value), str(e.value)


def test_a_missing_tensor_is_named(ckpt, target):
  _edit_tensors(ckpt, lambda t: t.pop("mtp.pre_fc_norm_hidden.weight"))
  _fails(ckpt, target, "missing tensor 'mtp.pre_fc_norm_hidden.weight'")


def test_a_missing_expert_is_named(ckpt, target):
  _edit_tensors(ckpt, lambda t: t.pop("mtp.layers.0.mlp.experts.5.up_proj.weight"))
  _fails(ckpt, target, "layer 0 up_proj", "7 of them", "num_experts=8", "[5]")


def test_missing_experts_are_named(ckpt, target):
  def drop(t):
    for name in [n for n in t if n.startswith("mtp.layers.0.mlp.experts.")]:
      t.pop(name)

  _edit_tensors(ckpt, drop)
  _fails(ckpt, target, "missing tensor 'mtp.layers.0.mlp.experts.0.gate_proj.weight'")


def test_an_extra_tensor_is_named(ckpt, target):
  _edit_tensors(ckpt, lambda t: t.update({"mtp.layers.0.linear_attn.A_log": np.zeros(4, "f4")}))
  _fails(ckpt, target, "unexpected tensor 'mtp.layers.0.linear_attn.A_log'")


def test_an_expert_past_the_count_is_named(ckpt, target):
  def add(t):
    t["mtp.layers.0.mlp.experts.8.down_proj.weight"] = t[
      "mtp.layers.0.mlp.experts.0.down_proj.weight"
    ]

  _edit_tensors(ckpt, add)
  _fails(ckpt, target, "unexpected tensor 'mtp.layers.0.mlp.experts.8.down_proj.weight'")


def test_mis_shaped_tensors_are_named(ckpt, target):
  def edit(t):
    t["mtp.layers.0.mlp.experts.3.gate_proj.weight"] = np.zeros((24, 30), "f4")

  _edit_tensors(ckpt, edit)
  _fails(ckpt, target, "experts have differing shapes")
  shutil.copy(os.path.join(SOURCE, "model.safetensors"), ckpt)

  def edit_all(t):
    for j in range(8):
      t[f"mtp.layers.0.mlp.experts.{j}.down_proj.weight"] = np.zeros((24, 32), "f4")

  _edit_tensors(ckpt, edit_all)
  _fails(
    ckpt, target, "'mtp.layers.0.mlp.experts.0.down_proj.weight' has shape (24, 32)", "(32, 24)"
  )
  shutil.copy(os.path.join(SOURCE, "model.safetensors"), ckpt)
  _edit_tensors(ckpt, lambda t: t.update({"mtp.fc.weight": np.zeros((32, 32), "f4")}))
  _fails(ckpt, target, "'mtp.fc.weight' has shape (32, 32), expected (32, 64)")


def test_dedicated_embeddings_and_several_layers_are_refused(ckpt, target):
  _edit_config(ckpt, lambda d: d.update(mtp_use_dedicated_embeddings=True))
  _fails(ckpt, target, "mtp_use_dedicated_embeddings")
  _edit_config(
    ckpt, lambda d: d.update(mtp_use_dedicated_embeddings=False, mtp_num_hidden_layers=2)
  )
  _fails(ckpt, target, "2 MTP layers")


def test_the_head_in_a_vision_language_wrapper_loads(tmp_path):
  # Qwen3.5 as published: the MTP layer count in text_config, `mtp.*` beside
  # `model.language_model.*`. The target ignores the head; load_drafter reads it.
  wrapper = shutil.copytree("tests/fixtures/hybrid/qwen3_5_vl", tmp_path / "vl")
  target = specdec.load(str(wrapper), dtype=jnp.float32)
  head = mtp_drafter(target, seed=3)
  flat = heads.flat_params(head.weights["head"])
  names = tensor_names(target.config, "qwen3_next")
  written = {
    names[p][0]: np.asarray(v).T if names[p][1] else np.asarray(v) for p, v in flat.items()
  }
  assert all(n.startswith("mtp.") for n in written)
  _edit_tensors(str(wrapper), lambda t: t.update(written))
  _edit_config(str(wrapper), lambda d: d["text_config"].update(mtp_num_hidden_layers=1))

  ids = np.load(os.path.join(wrapper, "reference.npz"))["input_ids"]
  again = specdec.load(str(wrapper), dtype=jnp.float32)
  np.testing.assert_array_equal(np.asarray(again.logits(ids)), np.asarray(target.logits(ids)))
  drafter = specdec.load_drafter(str(wrapper), target)
  assert isinstance(drafter, MTP) and drafter.spec.layout == "qwen3_next"
  for p, v in heads.flat_params(drafter.weights["head"]).items():
    np.testing.assert_array_equal(np.asarray(v), np.asarray(flat[p]), err_msg=p)
  _edit_config(str(wrapper), lambda d: d["text_config"].update(mtp_num_hidden_layers=2))
  with pytest.raises(CheckpointError, match="2 MTP layers"):
    specdec.load_drafter(str(wrapper), target)
