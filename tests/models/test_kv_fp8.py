"""FP8 (e4m3) KV cache: the cache arithmetic, logits and greedy identity with it, the k/v scales of
ModelOpt and compressed-tensors checkpoints (present, missing, malformed), and the sweep axis."""

import dataclasses

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict

import specdec
from configs import default
from specdec.checkpoint.safetensors_io import read_tensors, write_tensors
from specdec.checkpoint.zoo import resolve_path
from specdec.drafters import draft_lm, ngram
from specdec.lab import driver, results, sweep
from specdec.model import forward
from specdec.ops.kv_cache import FP8, from_cache, to_cache, write_cache
from specdec.quant.apply import quantize_model
from specdec.quant.layouts import kv_scale_names
from tests.helpers import GOLDEN, tiny_model

E4M3 = ml_dtypes.float8_e4m3fn
LAYOUTS = ["modelopt", "compressed-tensors"]
X = np.array([[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4], [9, 3, 4, 5, 9, 3, 4, 5, 9, 3, 4, 5]])
PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9, 3], [1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 4]]


def _rel_err(a, b) -> float:
  return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


# ------------------------------------------------------------------------------ cache arithmetic


def test_cache_codes_match_a_numpy_reference():
  scale = np.float32(0.37)
  x = np.random.default_rng(0).normal(0, 60, 4096).astype(np.float32)
  codes = np.asarray(to_cache(jnp.asarray(x), FP8, scale))
  want = np.clip(x / scale, -448, 448).astype(E4M3)
  np.testing.assert_array_equal(codes.view(np.uint8), want.view(np.uint8))
  back = np.asarray(from_cache(jnp.asarray(codes), scale, jnp.float32))
  np.testing.assert_array_equal(back, want.astype(np.float32) * scale)


def test_representable_values_round_trip_exactly_and_overflow_saturates():
  scale = np.float32(0.25)  # a power of two: code * scale is exact in float32
  every_code = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float32)
  finite = every_code[np.isfinite(every_code)]
  x = jnp.asarray(finite * scale)
  np.testing.assert_array_equal(np.asarray(from_cache(to_cache(x, FP8, scale), scale, x.dtype)), x)
  # JAX's cast does not saturate: without the clip these would read back as NaN.
  big = jnp.asarray([1e6, -1e6, 449 * 0.25, -np.inf], jnp.float32)
  out = np.asarray(from_cache(to_cache(big, FP8, scale), scale, jnp.float32))
  np.testing.assert_array_equal(out, [112.0, -112.0, 112.0, -112.0])


def test_write_cache_stores_codes_at_positions():
  cache_BSKH = jnp.zeros((2, 8, 1, 4), FP8)
  new_BTKH = jnp.arange(1, 17, dtype=jnp.float32).reshape(2, 2, 1, 4) * 10
  positions_BT = jnp.asarray([[3, 4], [0, 7]])
  cache_BSKH = write_cache(cache_BSKH, new_BTKH, positions_BT, 0.5)
  assert cache_BSKH.dtype == FP8
  out = np.asarray(cache_BSKH.astype(jnp.float32))
  want = np.clip(np.asarray(new_BTKH) / 0.5, -448, 448).astype(E4M3).astype(np.float32)
  np.testing.assert_array_equal(out[0, 3:5], want[0])
  np.testing.assert_array_equal(out[1, [0, 7]], want[1])
  assert not out[0, :3].any() and not out[1, 1:7].any()


@pytest.mark.parametrize("bad", ["float8_e5m2", jnp.int8, "model"])
def test_unsupported_kv_dtype_is_refused(bad):
  with pytest.raises(ValueError, match="KV cache dtype"):
    specdec.generate(tiny_model(), [[1, 2]], max_new_tokens=2, kv_dtype=bad)


# ----------------------------------------------------------------------------- model and decode


@pytest.fixture(scope="module")
def zoo():
  return specdec.load(resolve_path("zoo:target"), dtype=jnp.float32)


def test_fp8_logits_stay_within_tolerance_of_the_f32_cache(zoo):
  """The trained zoo target, 19 prompt tokens: measured max|error| 3.1% of max|logit| with scales
  1.0, 3.8% calibrated; argmax agreement 17 of 19 both ways, the two others where the float32
  cache's top two logits lie 0.09 and 0.02 apart. The bound, 8%, sits above e4m3's own half-step
  of 6.25% of a value (3 mantissa bits), which a single logit may carry; the argmax may move only
  at such near-ties (top two closer than twice the largest logit error)."""
  X_BT = np.array([zoo.encode("def fibonacci(n):\n    if n < 2:\n        return n\n")])
  ref = np.asarray(zoo.logits(X_BT))
  top2 = np.sort(ref, -1)[..., -2:]
  for fp8 in (zoo.with_fp8_kv(), zoo.with_fp8_kv(*zoo.calibrate_kv_scales(X_BT))):
    got = np.asarray(fp8.logits(X_BT))
    assert 0 < _rel_err(got, ref) <= 0.08
    same = got.argmax(-1) == ref.argmax(-1)
    assert same.mean() >= 0.85
    near_tie = top2[..., 1] - top2[..., 0] < 2 * np.abs(got - ref).max()
    assert np.all(same | near_tie)
  # The scales ride in the params, but a cache that is not FP8 never reads them: bit-identical.
  fp8 = zoo.with_fp8_kv(0.01, 0.02)
  np.testing.assert_array_equal(
    np.asarray(forward(fp8.params, jnp.asarray(X_BT), zoo.config, zoo.dtype).logits), ref
  )


def test_greedy_identity_against_plain_decode_with_the_same_fp8_cache():
  target = tiny_model(seed=0)
  fp8 = target.with_fp8_kv(np.float32([0.02, 0.03]), 0.05)
  plain = specdec.generate(fp8, PROMPTS, max_new_tokens=24).tokens
  # The FP8 cache is in effect: this tiny model's greedy text moves off the float32 one.
  assert plain != specdec.generate(target, PROMPTS, max_new_tokens=24).tokens
  # Asking for FP8 on a model without scales means scales 1.0.
  assert specdec.generate(target, PROMPTS, max_new_tokens=24, kv_dtype="float8_e4m3fn").tokens == (
    specdec.generate(target.with_fp8_kv(1.0, 1.0), PROMPTS, max_new_tokens=24).tokens
  )
  for drafter, k in ((ngram(min_n=1, max_n=3), 4), (draft_lm(target), 3), (draft_lm(fp8), 8)):
    out = specdec.generate(fp8, PROMPTS, max_new_tokens=24, drafter=drafter, k=k)
    assert out.tokens == plain, drafter.name


@pytest.mark.slow
@pytest.mark.parametrize("method", ["mtp", "eagle3", "block8"])
def test_learned_drafters_keep_the_gate_on_an_fp8_target(zoo, method):
  """MTP / EAGLE-3 / DFlash read the target's taps and hidden states, not its cache."""
  fp8 = zoo.with_fp8_kv()
  drafter = sweep.load_drafter(method, f"zoo:{method}", fp8, jnp.float32)
  prompts = [fp8.encode("def add(a, b):\n    return"), fp8.encode("for i in range(")]
  plain = specdec.generate(fp8, prompts, max_new_tokens=16).tokens
  out = specdec.generate(fp8, prompts, max_new_tokens=16, drafter=drafter, k=4)
  assert out.tokens == plain
  assert out.stats["tau"] > 1.0  # the drafter is not just being rejected


def test_bad_scales_given_to_the_model_are_refused():
  m = tiny_model()
  for bad in ([1.0], [1.0, 0.0], [1.0, np.nan], -2.0):
    with pytest.raises(ValueError, match="k_scales"):
      m.with_fp8_kv(k_scales=bad)


# -------------------------------------------------------------------------------- checkpoints


def _wide(model, c=2000.0):
  """The same function with K and V c times larger (q and o shrink to match): at scale 1.0 an FP8
  cache clips them at 448, so only the right scales keep the logits."""
  factor = {"k_norm": c, "q_norm": 1 / c, "v_proj": c, "o_proj": 1 / c}
  flat = flatten_dict(model.params["params"])
  flat = {k: v * factor.get(k[-2], 1.0) for k, v in flat.items()}
  return dataclasses.replace(model, params={"params": unflatten_dict(flat)})


@pytest.fixture(scope="module")
def fp8_weights():
  dense = _wide(tiny_model(scale=4.0, hidden_size=64, intermediate_size=128))
  return quantize_model(dense, "fp8")


def _save_with_kv(model, path, layout, *scales):
  specdec.save(str(path), model.with_fp8_kv(*scales), layout=layout)
  return str(path / "model.safetensors")


def _edit(file, fn):
  t = dict(read_tensors(file))
  fn(t)
  write_tensors(file, t)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_checkpoint_kv_scales_load_and_are_used(fp8_weights, tmp_path, layout):
  k_L, v_L = fp8_weights.calibrate_kv_scales(X)
  assert k_L.min() > 1.0 and v_L.min() > 1.0  # K/V beyond 448: scale 1.0 would clip
  file = _save_with_kv(fp8_weights, tmp_path, layout, k_L, v_L)
  stored = read_tensors(file)
  k_name, v_name = kv_scale_names(layout, 1)
  assert k_name.endswith("k_proj.k_scale" if layout == "modelopt" else "self_attn.k_scale")
  assert stored[v_name].dtype == np.float32 and stored[v_name].reshape(()) == v_L[1]

  loaded = specdec.load(str(tmp_path), dtype=jnp.float32)
  assert loaded.kv_dtype == FP8
  np.testing.assert_array_equal(loaded.kv_scales()[0], k_L)
  np.testing.assert_array_equal(loaded.kv_scales()[1], v_L)
  ref = forward(fp8_weights.params, jnp.asarray(X), fp8_weights.config, jnp.float32).logits
  got = np.asarray(loaded.logits(X))
  # Measured 2.6% of max|logit| with these scales, 67% with scales 1.0 (the clipped cache).
  assert _rel_err(got, ref) <= 0.05
  assert _rel_err(loaded.with_fp8_kv(1.0, 1.0).logits(X), ref) >= 0.3
  # generate's default cache is the checkpoint's: the same text as asking for FP8 explicitly.
  base = specdec.generate(loaded, PROMPTS[:2], max_new_tokens=8).tokens
  assert base == specdec.generate(loaded, PROMPTS[:2], max_new_tokens=8, kv_dtype=FP8).tokens


@pytest.mark.parametrize("layout", LAYOUTS)
def test_declared_fp8_kv_without_scales_warns_and_uses_one(fp8_weights, tmp_path, layout):
  file = _save_with_kv(fp8_weights, tmp_path, layout, 0.5, 0.5)
  k0, v0 = kv_scale_names(layout, 0)
  k1, v1 = kv_scale_names(layout, 1)
  _edit(file, lambda t: [t.pop(n) for n in (k0, v0, v1)])
  with pytest.warns(UserWarning, match="3 k/v scale tensors are missing") as record:
    loaded = specdec.load(str(tmp_path), dtype=jnp.float32)
  message = str(record[0].message)
  assert str(tmp_path) in message and all(n in message for n in (k0, v0, v1))
  assert k1 not in message
  assert loaded.kv_dtype == FP8
  np.testing.assert_array_equal(np.stack(loaded.kv_scales()), [[1.0, 0.5], [1.0, 1.0]])


@pytest.mark.parametrize(
  "value, fragment",
  [
    (np.full((2,), 0.5, np.float32), "shape"),
    (np.array(3, np.int32), "int32"),
    (np.array(0.0, np.float32), "> 0"),
    (np.array(np.inf, np.float32), "> 0"),
  ],
)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bad_scale_tensor_is_named(fp8_weights, tmp_path, layout, value, fragment):
  file = _save_with_kv(fp8_weights, tmp_path, layout, 0.5, 0.5)
  name = kv_scale_names(layout, 1)[1]
  _edit(file, lambda t: t.update({name: value}))
  with pytest.raises(specdec.CheckpointError, match=rf"{name}.*{fragment}"):
    specdec.load(str(tmp_path))


def test_scale_in_the_other_layouts_place_is_named(fp8_weights, tmp_path):
  file = _save_with_kv(fp8_weights, tmp_path, "modelopt", 0.5, 0.5)
  ct_name = kv_scale_names("compressed-tensors", 0)[0]
  _edit(file, lambda t: t.update({ct_name: np.array([0.5], np.float32)}))
  with pytest.raises(specdec.CheckpointError, match=rf"{ct_name}.*modelopt layout"):
    specdec.load(str(tmp_path))


def test_scale_without_a_declared_fp8_kv_cache_is_refused(fp8_weights, tmp_path):
  specdec.save(str(tmp_path), fp8_weights, layout="modelopt")
  name = kv_scale_names("modelopt", 0)[0]
  _edit(str(tmp_path / "model.safetensors"), lambda t: t.update({name: np.array(0.5, np.float32)}))
  with pytest.raises(specdec.CheckpointError, match=rf"{name}.*declares no FP8 KV cache"):
    specdec.load(str(tmp_path))


def test_fp8_kv_is_not_written_without_a_quantization_config(tmp_path):
  with pytest.raises(ValueError, match="FP8 KV cache"):
    specdec.save(str(tmp_path), tiny_model().with_fp8_kv())


# -------------------------------------------------------------------------------------- sweep


def test_sweep_runs_an_fp8_kv_axis(tmp_path):
  c = default.get_config()
  c.update(dict(target=f"{GOLDEN}/qwen3_gqa", methods=("null", "ngram"), ks=(2,)))
  c.update(dict(n_prompts=2, max_new_tokens=8, kv_dtypes=("model", "float8_e4m3fn")))
  c.update(dict(workloads=("humaneval",), prompt_tokens=(0,)))
  driver.run(c, str(tmp_path / "run"), progress=False)
  rows = results.load_rows(str(tmp_path / "run" / "results.jsonl"))
  assert {r["kv_dtype"] for r in rows} == {"model", "float8_e4m3fn"}
  assert all(r["gate_passed"] for r in rows)


def test_sweep_refuses_an_unknown_kv_dtype(tmp_path):
  c = default.get_config()
  c.update(dict(target=f"{GOLDEN}/qwen3_gqa", methods=("null",), kv_dtypes=("float8_e5m2",)))
  with pytest.raises(sweep.SweepError, match="float8_e5m2"):
    driver.run(c, str(tmp_path / "run"), progress=False)
