"""Tensor parallelism of hybrid targets on a fake 4-device CPU mesh: Gated DeltaNet, gated
attention, a dense MLP and routed experts with a shared expert give the single-device float32
logits at TP 2 and 4 and greedy speculative output (TP 4 here, TP 2 for a loaded target with its
MTP head); the memory plan counts the sharded states per device; undividable meshes are refused."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import specdec
from specdec import sharding
from specdec.drafters import ngram
from tests.helpers import tiny_hybrid_config, tiny_hybrid_model

PROMPTS = [[5, 9, 13, 2, 7, 7, 31], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]]
# float32 logits of the same model, sharded or not: XLA reduces partial sums in another order.
TOL = 1e-5
# 8 heads over 4 kv heads, 4 linear key heads of 2 value heads each: every split divides at TP 4.
# Layer 0 is Gated DeltaNet with a dense MLP, layer 1 gated attention with the routed experts.
SIZES = dict(
  num_attention_heads=8, num_key_value_heads=4, linear_num_key_heads=4, linear_num_value_heads=8
)


@pytest.fixture(scope="module")
def model():
  return tiny_hybrid_model(**SIZES)


@pytest.fixture(scope="module")
def greedy(model):
  return specdec.generate(model, PROMPTS, max_new_tokens=8, drafter=ngram(), k=3).tokens


@pytest.mark.parametrize("tp", [2, 4])
def test_sharded_logits_equal_single_device_logits(model, tp):
  sharded = sharding.on_mesh(model, sharding.make_mesh(tensor=tp))
  spec = lambda x: x.sharding.spec  # noqa: E731
  gdn, moe = (sharded.params["params"][f"layer_{i}"] for i in (0, 1))
  assert spec(gdn["linear_attn"]["in_proj_qkvz"]["kernel"]) == P(None, "tensor")
  assert spec(gdn["linear_attn"]["out_proj"]["kernel"]) == P("tensor", None)
  assert spec(gdn["linear_attn"]["A_log"]) == P("tensor")
  assert spec(moe["mlp"]["experts"]["down_proj"]) == P(None, "tensor", None)
  assert spec(moe["mlp"]["router"]["kernel"]) == P()
  assert sharding.bytes_per_device(sharded.params) < sharding.bytes_per_device(model.params)
  tokens = np.array([p[:7] for p in PROMPTS], np.int32)
  np.testing.assert_allclose(sharded.logits(tokens), model.logits(tokens), atol=TOL, rtol=TOL)


def test_greedy_speculative_output_is_the_single_device_output(model, greedy):
  mesh = sharding.make_mesh(tensor=4)
  got = specdec.generate(model, PROMPTS, max_new_tokens=8, drafter=ngram(), k=3, mesh=mesh)
  assert got.tokens == greedy


def test_the_memory_plan_counts_the_states_as_each_device_holds_them(model):
  """The plan's bytes per device are those of the decode state generate() leaves on a device
  (the prefill of the greedy test above, placed as generate places it): the KV cache and the
  recurrent and conv states a quarter each at TP 4, the rest whole."""
  from specdec.decoding import generate as generate_lib
  from specdec.decoding import memory
  from specdec.decoding.step import prefill

  mesh = sharding.make_mesh(tensor=4)
  sharded = sharding.on_mesh(model, mesh)
  plan = generate_lib._plan(
    sharded, PROMPTS, max_new_tokens=8, temperature=0.0, top_k=0, top_p=1.0, drafter=ngram(),
    k=3, acceptance=None, max_slots=None, min_bucket=generate_lib.MIN_BUCKET, kv_dtype=None,
    memory_fraction=None, prefill_chunk=generate_lib.PREFILL_CHUNK,
  )  # fmt: skip
  B, sc = plan.batch, plan.sc
  prompt_BT = np.zeros((B, plan.bucket), np.int32)
  for i, p in enumerate(PROMPTS):
    prompt_BT[i, : len(p)] = p
  lengths_B = jnp.asarray([len(p) for p in PROMPTS], jnp.int32)
  max_new_B = jnp.full((B,), 8, jnp.int32)
  lengths_B, max_new_B = jax.device_put((lengths_B, max_new_B), sharding.replicated(mesh))
  with jax.set_mesh(mesh):
    st = prefill(
      sharded.params, sc.drafter.params, jnp.asarray(prompt_BT), lengths_B, max_new_B,
      jax.random.key(0), sc, plan.slots,
    )  # fmt: skip
    st = jax.device_put(st, sharding.decode_state_shardings(st, mesh))
  held = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(st))
  args = (sc.drafter, sc.k, B, plan.bucket, plan.slots)
  slot, other = memory.state_cost(sharded, *args)
  assert B * plan.slots * slot + other == held
  # Unsharded, the plan counts the recurrent and conv states (which do not grow with the
  # slots) whole: four times what each device holds of them.
  states = memory.tree_bytes((st.cache.rec, st.cache.conv))
  assert memory.state_cost(model, *args)[1] - other == states - states // 4 > 0


def test_the_states_follow_the_heads_they_belong_to(model):
  from specdec.models.hybrid import HybridCache

  mesh = sharding.make_mesh(tensor=2)
  cache = HybridCache.zeros(model.config, 2, 16, jnp.float32)
  placed = jax.device_put(cache, sharding.cache_shardings(cache, mesh))
  assert placed.kv.k[0].sharding.spec == P(None, None, "tensor")  # [B, S, K, H]: by K
  assert placed.conv[0].sharding.spec == P(None, None, "tensor")  # [B, w, X]: by key head
  assert placed.rec[0].sharding.spec == P(None, "tensor")  # [B, Y, H, U]: by value head
  # The prefill forward leaves each state split as it was placed, so decode chunks share one.
  sharded = sharding.on_mesh(model, mesh)
  tokens = jnp.asarray([p[:7] for p in PROMPTS], jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(7, dtype=jnp.int32), (2, 7))
  verify = lambda p, c: sharded.module.apply(p, tokens, positions, c).cache.settle(n_B)  # noqa: E731
  n_B = jnp.array([7, 3])
  with jax.set_mesh(mesh):
    settled = jax.jit(verify)(sharded.params, placed)
  assert settled.rec[0].sharding.spec[:2] == (None, "tensor")
  assert settled.conv[0].sharding.spec[:3] == (None, None, "tensor")


@pytest.mark.parametrize(
  "change, named",
  [
    (dict(linear_num_key_heads=2), "'linear_num_key_heads': 2"),
    (dict(num_key_value_heads=2), "'num_key_value_heads': 2"),
    (dict(moe_intermediate_size=6), "'moe_intermediate_size': 6"),
    (dict(shared_expert_intermediate_size=10), "'shared_expert_intermediate_size': 10"),
  ],
)
def test_a_mesh_that_does_not_divide_a_split_is_refused_naming_the_key(change, named):
  config = tiny_hybrid_config(**{**SIZES, **change})
  with pytest.raises(
    sharding.ShardingError, match=re.escape(f"tensor=4 does not divide {{{named}}}")
  ):
    sharding.check_divides(config, 4)


def test_the_refusal_comes_before_anything_is_placed(model):
  with pytest.raises(sharding.ShardingError, match="tensor=3 does not divide"):
    sharding.on_mesh(model, sharding.make_mesh(tensor=3))


def test_a_loaded_target_and_its_mtp_head_keep_greedy_identity_at_tp2():
  source = "tests/fixtures/hybrid/qwen3_next_mtp"
  target = specdec.load(source, dtype=jnp.float32)
  kw = dict(max_new_tokens=8, drafter=specdec.load_drafter(source, target), k=2)
  want = specdec.generate(target, PROMPTS, **kw).tokens
  mesh = sharding.make_mesh(tensor=2)
  sharded = specdec.load(source, dtype=jnp.float32, mesh=mesh)
  ba = sharded.params["params"]["layer_0"]["linear_attn"]["in_proj_ba"]["kernel"]
  assert ba.sharding.spec == P(None, "tensor")
  kw["drafter"] = specdec.load_drafter(source, sharded)
  assert specdec.generate(sharded, PROMPTS, mesh=mesh, **kw).tokens == want
