"""specdec.bench.random_models: seeded fills, random params of every format and their byte counts,
format checks, synthetic decode states, the walk target."""

import jax
import jax.numpy as jnp
import pytest

import specdec
from configs import bench_decode as bench_config
from specdec.bench import random_models
from specdec.decoding.tree import binary_paths
from specdec.drafters.oracle import oracle
from specdec.quant.exl3 import EXL3Weight
from specdec.quant.nvfp4 import NVFP4Weight


def _tiny():
  return random_models.model_config(bench_config.TINY)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32, jnp.float16])
def test_float_fill_is_bounded_varied_and_seeded(dtype):
  x = random_models.fill((64, 64), dtype, seed=3, scale=0.5).astype(jnp.float32)
  assert float(jnp.max(jnp.abs(x))) <= 0.5
  assert float(jnp.std(x)) > 0.2  # uniform on [-0.5, 0.5) has std 0.29; zeros would give 0
  assert not jnp.array_equal(x, random_models.fill((64, 64), dtype, seed=4, scale=0.5))


def test_integer_and_e4m3_fills():
  i16 = random_models.fill((4096,), jnp.int16, 0)
  assert int(i16.min()) < -16000 and int(i16.max()) > 16000
  scales = random_models.fill((4096,), jnp.float8_e4m3fn, 0).astype(jnp.float32)
  assert bool(jnp.all(jnp.isfinite(scales))) and float(scales.min()) >= 0.5
  assert float(scales.max()) < 1.0


@pytest.mark.parametrize("fmt", random_models.FORMATS)
def test_random_params_types_and_bytes(fmt):
  config, batch, slots = _tiny(), 2, 16
  params = random_models.random_params(config, fmt)
  p = params["params"]
  kernel = p["layer_0"]["mlp"]["down_proj"]["kernel"]
  want = {"bf16": jax.Array, "nvfp4": NVFP4Weight, "exl3_4": EXL3Weight}[fmt]
  assert isinstance(kernel, want) and kernel.shape == (256, 128)
  assert isinstance(p["lm_head"]["kernel"], jax.Array)  # the LM head stays dense

  D, F, V, H, N, K = 128, 256, 256, 64, 4, 2
  linear = [(D, N * H), (D, K * H), (D, K * H), (N * H, D), (D, F), (D, F), (F, D)]
  per_weight = {
    "bf16": lambda i, o: 2 * i * o,
    "nvfp4": lambda i, o: i * o // 2 + i * o // 16 + 4 * o,  # codes, E4M3 scales, f32 global
    "exl3_4": lambda i, o: i * o // 2 + 2 * i + 2 * o,  # 4-bit trellis, f16 suh and svh
  }[fmt]
  norms = 2 * (3 * D + 2 * H)  # attn, mlp, final; q and k
  want_weights = sum(per_weight(i, o) for i, o in linear) + 2 * D * V + norms + 2 * batch * D
  nbytes = random_models.step_bytes(params, config, batch, slots, jnp.bfloat16)
  assert nbytes == {"weight_bytes": want_weights, "kv_bytes": 2 * 1 * batch * slots * K * H * 2}

  model = random_models.random_model(config, fmt)
  logits = model.logits(jnp.ones((1, 4), jnp.int32))
  assert bool(jnp.all(jnp.isfinite(logits)))


def test_check_format_names_the_layer_that_does_not_fit():
  config = random_models.model_config({**bench_config.TINY, "intermediate_size": 208})
  with pytest.raises(random_models.BenchConfigError, match="layer_0/mlp/down_proj.*exl3_4.*128"):
    random_models.check_format(config, "exl3_4")
  random_models.check_format(config, "nvfp4")  # 208 is a multiple of NVFP4's 16


def test_synthetic_state_is_a_decodable_state():
  config = _tiny()
  st = random_models.synthetic_state(config, 2, 32, 20, 0, jnp.bfloat16)
  assert st.cache.k[0].shape == (2, 32, 2, 64) and int(st.lengths[0]) == 20
  assert not jnp.array_equal(st.cache.k[0], st.cache.v[0])
  assert int(st.tokens.max()) < config.vocab_size and int(st.tokens.min()) >= 0


def test_walk_model_decodes_its_walk_at_every_verify_width_in_bf16():
  model, next_V = random_models.walk_model(_tiny(), jnp.bfloat16, seed=1)
  assert sorted(next_V.tolist()) == list(range(256))
  t, cycle = int(next_V[0]), 1
  while t != 0:
    t, cycle = int(next_V[t]), cycle + 1
  assert cycle == 256  # one cycle through the vocabulary: the walk does not repeat early
  prompt = [5, 9, 200, 17, 3, 3, 42]
  walk = [int(next_V[prompt[-1]])]
  while len(walk) < 48:
    walk.append(int(next_V[walk[-1]]))
  assert specdec.generate(model, [prompt], max_new_tokens=48).tokens == [walk]
  d = oracle([prompt + walk], 256, miss=0.3)
  for kw in (dict(k=8), dict(tree=binary_paths(9))):
    assert specdec.generate(model, [prompt], 48, drafter=d, **kw).tokens == [walk], kw
  # Its logits are sharp enough that sampling draws the walk too (experiments.bench_budget's T > 0).
  assert specdec.generate(model, [prompt], 48, temperature=1.0, seed=3).tokens == [walk]
  g = specdec.generate(model, [prompt], 48, temperature=0.6, seed=4, drafter=d, k=4)
  assert g.tokens == [walk] and g.stats["tau"] > 1.5
