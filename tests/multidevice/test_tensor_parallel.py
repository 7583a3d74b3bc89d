"""Tensor parallelism on a fake 4-device CPU mesh: sharded logits equal single-device logits and
greedy speculative output is token-identical, for TP = 2 and 4, every drafter kind (the trained
heads at TP 2 only: the zoo target has 2 kv heads; untrained ones at TP 4)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import specdec
from specdec import sharding
from specdec.drafters import draft_lm, ngram
from tests.helpers import tiny_model

PROMPTS = [[5, 9, 13, 2, 7, 7, 31], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]]
# float32 logits of the same model, sharded or not: XLA reduces partial sums in another order.
TOL = 1e-5


@pytest.fixture(scope="module")
def model():
  return tiny_model(num_attention_heads=4, num_key_value_heads=4)


@pytest.mark.parametrize("tp", [2, 4])
def test_sharded_logits_equal_single_device_logits(model, tp):
  mesh = sharding.make_mesh(tensor=tp)
  sharded = sharding.on_mesh(model, mesh)
  q = sharded.params["params"]["layer_0"]["attn"]["q_proj"]["kernel"]
  assert q.sharding.spec == P(None, "tensor") and len(q.addressable_shards) == tp
  assert sharding.bytes_per_device(sharded.params) < sharding.bytes_per_device(model.params)
  tokens = np.array([p[:7] for p in PROMPTS], np.int32)
  np.testing.assert_allclose(sharded.logits(tokens), model.logits(tokens), atol=TOL, rtol=TOL)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("name", ["null", "ngram", "draft_lm"])
def test_greedy_speculative_output_is_the_single_device_output(model, tp, name):
  drafter = {"null": None, "ngram": ngram(), "draft_lm": draft_lm(tiny_model(seed=1))}[name]
  kw = dict(max_new_tokens=12, drafter=drafter, k=3 if drafter else None)
  want = specdec.generate(model, PROMPTS, **kw).tokens
  got = specdec.generate(model, PROMPTS, mesh=sharding.make_mesh(tensor=tp), **kw)
  assert got.tokens == want


def test_a_mesh_that_does_not_divide_the_heads_is_refused_before_compiling(model):
  with pytest.raises(sharding.ShardingError, match="tensor=3 does not divide"):
    sharding.on_mesh(model, sharding.make_mesh(tensor=3))
  with pytest.raises(sharding.ShardingError, match="needs 8 devices; 4 present"):
    sharding.make_mesh(tensor=8)


def test_the_kv_cache_follows_the_kv_heads(model):
  from specdec.decoding import generate as generate_lib
  from specdec.decoding.step import prefill

  mesh = sharding.make_mesh(tensor=2)
  sharded = sharding.on_mesh(model, mesh)
  plan = generate_lib._plan(
    sharded, PROMPTS[:1], 8, 0.0, 0, 1.0, None, None, None, None, 16, None, None, 2048
  )
  prompt = jnp.zeros((1, plan.bucket), jnp.int32)
  with jax.set_mesh(mesh):
    st = prefill(
      sharded.params, (), prompt, jnp.array([7]), jnp.array([8]), jax.random.key(0), plan.sc,
      plan.slots,
    )  # fmt: skip
  assert tuple(st.cache.k[0].sharding.spec)[:3] == (None, None, "tensor")  # [B, S, K, H]: by K


@pytest.mark.parametrize("name", ["mtp", "eagle3", "block8"])
def test_learned_drafters_keep_greedy_identity_on_the_zoo_target_at_tp2(name):
  from specdec.checkpoint.zoo import resolve_path

  path = resolve_path(f"zoo:{name}")
  target = specdec.load(resolve_path("zoo:target"), dtype=jnp.float32)
  load = {"mtp": specdec.drafters.load_mtp, "eagle3": specdec.drafters.load_eagle3}
  drafter = load.get(name, specdec.drafters.load_block)(path, target)
  prompts = ["def fibonacci(n):\n", "import os\n\n\ndef walk(path):\n"]
  kw = dict(max_new_tokens=10, drafter=drafter, k=3)
  want = specdec.generate(target, prompts, **kw).tokens
  mesh = sharding.make_mesh(tensor=2)
  sharded = specdec.load(resolve_path("zoo:target"), dtype=jnp.float32, mesh=mesh)
  assert specdec.generate(sharded, prompts, mesh=mesh, **kw).tokens == want


def test_the_zoo_target_cannot_split_over_four_devices():
  """Why the trained heads above stop at TP 2: the zoo target has 2 kv heads."""
  from specdec.checkpoint.zoo import resolve_path

  with pytest.raises(sharding.ShardingError, match="tensor=4 does not divide.*num_key_value_heads"):
    specdec.load(resolve_path("zoo:target"), dtype=jnp.float32, mesh=sharding.make_mesh(tensor=4))


@pytest.fixture(scope="module")
def deep():
  """3 layers (EAGLE-3 taps three distinct ones), 4 q and 4 kv heads: TP 4 divides them; and its
  plain single-device greedy output, which every drafter's must equal."""
  model = tiny_model(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4)
  return model, specdec.generate(model, PROMPTS, max_new_tokens=12).tokens


@pytest.mark.parametrize("name", ["mtp", "eagle3", "block8"])
def test_learned_drafters_keep_greedy_identity_at_tp4(deep, name):
  """Untrained heads (the zoo's trained ones cannot go to TP 4): mostly rejected drafts, so this
  checks the sharded taps and the rollback, the TP 2 test above acceptance."""
  from specdec.drafters import block, eagle3, mtp

  model, want = deep
  make = {"mtp": mtp.mtp, "eagle3": eagle3.eagle3, "block8": lambda t: block.block(t, block_size=8)}
  mesh = sharding.make_mesh(tensor=4)
  got = specdec.generate(
    model, PROMPTS, max_new_tokens=12, drafter=make[name](model), k=3, mesh=mesh
  )
  assert got.tokens == want


def test_the_memory_plan_counts_bytes_per_device(model):
  from specdec.decoding import memory

  sharded = sharding.on_mesh(model, sharding.make_mesh(tensor=4))
  assert sharding.tensor_size(sharded.params) == 4 and sharding.tensor_size(model.params) == 1
  budget = memory.DeviceMemory(limit_bytes=8 * 2**20, in_use_bytes=0)
  args = (ngram(), 3, 4, 64, 4096)
  # Unsharded, 4096 slots at B = 4 overflow the 8 MiB budget; a quarter of the KV per device fits.
  with pytest.raises(memory.MemoryPlanError):
    memory.check_fits(model, *args, memory=budget)
  assert memory.check_fits(sharded, *args, memory=budget) >= 4096


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_quantized_weights_split_without_cutting_a_group(model, fmt):
  from specdec.quant.apply import quantize_model

  q = quantize_model(model, fmt)
  sharded = sharding.on_mesh(q, sharding.make_mesh(tensor=2))
  attn = sharded.params["params"]["layer_0"]["attn"]
  first = attn["q_proj"]["kernel"]
  codes = first.packed_NP if fmt == "nvfp4" else first.codes_NK
  assert tuple(codes.sharding.spec) == ("tensor", None)  # column-parallel: by output features
  tokens = np.array([p[:7] for p in PROMPTS], np.int32)
  np.testing.assert_allclose(sharded.logits(tokens), q.logits(tokens), atol=TOL, rtol=TOL)
  kw = dict(max_new_tokens=10, drafter=ngram(), k=3)
  want = specdec.generate(q, PROMPTS, **kw).tokens
  assert specdec.generate(sharded, PROMPTS, **kw).tokens == want
  if fmt == "nvfp4":  # down_proj's K = 96 over 4 devices: 24-wide shards cut 16-wide groups
    cut = "down_proj/kernel: K=96 over tensor=4 gives 24"
    with pytest.raises(sharding.ShardingError, match=cut):
      sharding.on_mesh(q, sharding.make_mesh(tensor=4))


def test_the_attention_kernel_runs_per_device_over_its_own_heads():
  # The kernel's own math in jnp (`reference_partials`) stands in for the Pallas call on the CPU.
  import functools

  from kernels_pallas import decode_attention as da
  from specdec.ops.attention import attend_xla, by_heads

  B, T, N, K, H, S = 2, 3, 8, 4, 64, 128
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (B, T, N, H), jnp.float32)
  k, v = (jax.random.normal(x, (B, S, K, H), jnp.float32) for x in keys[1:])
  pos = jnp.array([[20, 21, 22], [40, 41, 42]], jnp.int32)
  kernel = functools.partial(da.decode_attention, partials=da.reference_partials)
  mesh = sharding.make_mesh(tensor=2)
  with jax.set_mesh(mesh):
    got = jax.jit(lambda *a: by_heads(kernel)(*a))(q, k, v, pos)
    assert by_heads(kernel) is not kernel
  assert by_heads(kernel) is kernel  # no mesh: the kernel as is
  np.testing.assert_allclose(got, attend_xla(q, k, v, pos), atol=2e-5, rtol=2e-5)


def test_a_tree_forward_runs_per_device_with_its_mask_replicated():
  import functools

  from kernels_pallas import decode_attention as da
  from specdec.decoding.tree import tree
  from specdec.ops.attention import TreeMask, attend_xla, by_heads

  t = tree([(0,), (1,), (0, 0)])
  B, N, K, H, S = 2, 8, 4, 64, 128
  keys = jax.random.split(jax.random.key(1), 3)
  q = jax.random.normal(keys[0], (B, t.size, N, H), jnp.float32)
  k, v = (jax.random.normal(x, (B, S, K, H), jnp.float32) for x in keys[1:])
  mask = TreeMask(jnp.asarray([0, 70], jnp.int32), np.arange(t.size), t.ancestors)
  pos = mask.root_B[:, None] + jnp.asarray(t.depths)[None, :]
  kernel = functools.partial(da.decode_attention, partials=da.reference_partials)
  with jax.set_mesh(sharding.make_mesh(tensor=2)):
    got = jax.jit(lambda *a, tree: by_heads(kernel)(*a, tree=tree))(q, k, v, pos, tree=mask)
  np.testing.assert_allclose(got, attend_xla(q, k, v, pos, mask), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_compiled_ahead_under_a_mesh_the_run_builds_nothing_more(model, fmt):
  from specdec.decoding import generate as generate_lib
  from specdec.quant.apply import quantize_model

  target = model if fmt == "bf16" else quantize_model(model, fmt)
  mesh = sharding.make_mesh(tensor=2)
  kw = dict(drafter=ngram(), k=5, min_bucket=32, seed=7, mesh=mesh)
  # 40 new tokens: 128 cache slots, other executables; it builds the small eager ops of a run.
  specdec.generate(target, PROMPTS, max_new_tokens=40, **kw)
  built = generate_lib.compile_ahead(target, PROMPTS, max_new_tokens=13, **kw)  # 64 slots
  assert built.count >= 2  # the prefill and the decode chunk
  got = specdec.generate(target, PROMPTS, max_new_tokens=13, **kw)
  assert got.stats["compiles"] == 0
  kw.pop("mesh")
  assert got.tokens == specdec.generate(target, PROMPTS, max_new_tokens=13, **kw).tokens
