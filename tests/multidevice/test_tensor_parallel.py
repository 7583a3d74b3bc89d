"""Tensor parallelism on a fake 4-device CPU mesh: sharded logits equal single-device logits, and
greedy speculative output is the single-device greedy output for TP = 2 and 4 and every drafter
kind, each at one degree with both degrees covered: chains and static trees of the model-free
drafters and the draft LM, the zoo's trained heads at TP 2 (its target has 2 kv heads), untrained
MTP / EAGLE-3 / DFlash / DFlash2 / DSpark heads at TP 4."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import specdec
from specdec import sharding
from specdec.drafters import draft_lm, ngram, suffix
from tests.helpers import tiny_model

PROMPTS = [[5, 9, 13, 2, 7, 7, 31], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]]
# float32 logits of the same model, sharded or not: XLA reduces partial sums in another order.
TOL = 1e-5
TREE = [(0,), (1,), (0, 0), (0, 1), (1, 0)]  # a static draft tree, as PATHS of child ranks


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


@pytest.fixture(scope="module")
def greedy(model):
  """The single-device greedy tokens that every drafter's sharded output must equal."""
  return specdec.generate(model, PROMPTS, max_new_tokens=12).tokens


@pytest.mark.parametrize(
  "name, tp",
  [
    ("null", 2),
    ("ngram", 4),
    ("draft_lm", 2),
    ("suffix", 4),
    ("ngram_tree", 2),
    ("suffix_tree", 4),
  ],
)
def test_greedy_speculative_output_is_the_single_device_output(model, greedy, name, tp):
  drafter = {
    "null": lambda: None,
    "ngram": ngram,
    "draft_lm": lambda: draft_lm(tiny_model(seed=1)),
    # Earlier outputs in its store: most drafts accepted, so the sharded cache's commits run.
    "suffix": lambda: suffix(store_size=64, history=greedy),
  }[name.removesuffix("_tree")]()
  kw = dict(tree=TREE) if name.endswith("_tree") else dict(k=3 if drafter else None)
  mesh = sharding.make_mesh(tensor=tp)
  got = specdec.generate(model, PROMPTS, max_new_tokens=12, drafter=drafter, mesh=mesh, **kw)
  assert got.tokens == greedy
  if "tree" in kw:
    assert got.stats["verify_width"] == len(TREE) + 1  # the tree verified, not a chain
  if name.startswith("suffix"):
    assert got.stats["acceptance_rate"] > 0.5


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


@pytest.fixture(scope="module")
def zoo():
  """The zoo target, loaded whole and onto a TP 2 mesh, with code prompts and its single-device
  greedy tokens for them."""
  from specdec.checkpoint.zoo import resolve_path

  path, mesh = resolve_path("zoo:target"), sharding.make_mesh(tensor=2)
  target = specdec.load(path, dtype=jnp.float32)
  prompts = ["def fibonacci(n):\n", "import os\n\n\ndef walk(path):\n"]
  want = specdec.generate(target, prompts, max_new_tokens=10).tokens
  return target, specdec.load(path, dtype=jnp.float32, mesh=mesh), mesh, prompts, want


@pytest.mark.parametrize("name", ["mtp", "eagle3", "block8"])
def test_learned_drafters_keep_greedy_identity_on_the_zoo_target_at_tp2(zoo, name):
  from specdec.checkpoint.zoo import resolve_path

  target, sharded, mesh, prompts, want = zoo
  load = {"mtp": specdec.drafters.load_mtp, "eagle3": specdec.drafters.load_eagle3}
  drafter = load.get(name, specdec.drafters.load_block)(resolve_path(f"zoo:{name}"), target)
  got = specdec.generate(sharded, prompts, max_new_tokens=10, drafter=drafter, k=3, mesh=mesh)
  assert got.tokens == want
  assert got.stats["accepted"] > 0  # trained heads: accepted drafts go through the sharded step


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


@pytest.mark.parametrize("name", ["mtp", "eagle3", "block8", "dflash2", "dspark"])
def test_learned_drafters_keep_greedy_identity_at_tp4(deep, name):
  """Untrained heads (the zoo's trained ones cannot go to TP 4): mostly rejected drafts, so this
  checks the sharded taps and the rollback, the TP 2 test above acceptance. DFlash2 adds the
  block's conv and selector, DSpark the Markov head sampling from the anchor and the confidence
  head."""
  from specdec.drafters import block, eagle3, mtp

  model, want = deep
  kinds = {
    "block8": {},
    "dflash2": dict(conv=True, selector=True, selector_top_k=4, selector_rank=8),
    "dspark": dict(
      sample_from_anchor=True, markov_rank=8, markov_head_type="rnn", confidence_head=True
    ),
  }
  make = {"mtp": mtp.mtp, "eagle3": eagle3.eagle3}
  make |= {k: lambda t, kw=kw: block.block(t, block_size=8, **kw) for k, kw in kinds.items()}
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
  if fmt == "fp8":  # placed before the call, decoded with no mesh= (test_quantized_tp passes one)
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


def test_compiled_ahead_under_a_mesh_the_run_builds_nothing_more(model, greedy):
  """(Quantized targets: test_sweep_mesh's TP sweep compiles its NVFP4 and FP8 cells ahead and
  times them with no compile.)"""
  from specdec.decoding import generate as generate_lib

  mesh = sharding.make_mesh(tensor=2)
  kw = dict(drafter=ngram(), k=5, min_bucket=32, seed=7, mesh=mesh)
  # 40 new tokens: 128 cache slots, other executables; it builds the small eager ops of a run.
  specdec.generate(model, PROMPTS, max_new_tokens=40, **kw)
  built = generate_lib.compile_ahead(model, PROMPTS, max_new_tokens=12, **kw)  # 64 slots
  assert built.count >= 2  # the prefill and the decode chunk
  got = specdec.generate(model, PROMPTS, max_new_tokens=12, **kw)
  assert got.stats["compiles"] == 0
  assert got.tokens == greedy
