"""FP8: golden files from compressed-tensors, both layouts, bad inputs, numerics."""

import functools
import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from specdec.ops.qmatmul import matmul
from specdec.quant import fp8
from specdec.quant.base import QuantizedWeight
from specdec.quant.errors import QuantFormatError
from specdec.quant.layouts import (
  CT,
  MODELOPT,
  LinearFormat,
  parse_quant_config,
  read_linear,
  write_linear,
  write_quant_config,
)
from tests.helpers import QUANT_FIXTURES, dense_KN, quant_tensors

E4M3 = ml_dtypes.float8_e4m3fn
TENSOR = "model.layers.0.self_attn.q_proj"  # f32 weights, per-tensor scale, static input_scale
CHANNEL = "model.layers.0.self_attn.k_proj"  # f32 1e-4..1e4 rows and an all-zero row, per channel
BF16 = "model.layers.1.self_attn.q_proj"  # bf16 weights: compressed-tensors stores a bf16 scale


@functools.cache
def scheme():
  return parse_quant_config(json.loads((QUANT_FIXTURES / "ct_config.json").read_text()))


def getter(d: dict):
  return lambda name: d[name]


def bits(a) -> np.ndarray:
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


@pytest.mark.parametrize("module", [TENSOR, CHANNEL, BF16])
def test_dequant_equals_compressed_tensors_bit_for_bit(module):
  w = read_linear(scheme(), module, getter(quant_tensors("ct_model.safetensors")), shape=(64, 32))
  assert isinstance(w, fp8.FP8Weight)
  # f32, or bf16 for a bf16 scale
  ref = quant_tensors("ct_reference.safetensors")[module + ".dequant"]
  np.testing.assert_array_equal(bits(w.dequantize(ref.dtype).T), bits(ref))


@pytest.mark.parametrize("module, per_channel", [(TENSOR, False), (CHANNEL, True)])
def test_quantizer_reproduces_compressed_tensors(module, per_channel):
  ckpt = quant_tensors("ct_model.safetensors")
  q = fp8.quantize(dense_KN(module), per_channel=per_channel)
  np.testing.assert_array_equal(bits(q.codes_NK), bits(ckpt[module + ".weight"]))
  scale = ckpt[module + ".weight_scale"].reshape(-1)
  np.testing.assert_array_equal(np.asarray(q.scale_N), np.broadcast_to(scale, (32,)))


def test_bf16_weights_differ_from_compressed_tensors_only_by_its_bf16_arithmetic():
  """For bf16 weights compressed-tensors rounds amax/448 and w/scale to bf16 before the e4m3 cast;
  emulating that reproduces its codes exactly, and our f32 codes are at most one e4m3 step away."""
  ckpt = quant_tensors("ct_model.safetensors")
  w_NK = dense_KN(BF16).T
  bf16, f32 = ml_dtypes.bfloat16, np.float32
  scale = (f32(np.abs(w_NK).max()) / f32(448)).astype(bf16)
  assert bits(scale) == bits(ckpt[BF16 + ".weight_scale"][0])
  emulated = np.clip((w_NK.astype(f32) / f32(scale)).astype(bf16).astype(f32), -448, 448)
  np.testing.assert_array_equal(bits(emulated.astype(E4M3)), bits(ckpt[BF16 + ".weight"]))
  ours = fp8.quantize(w_NK.T)
  assert abs(float(ours.scale_N[0]) / float(scale) - 1) < 2**-8
  # e4m3 bytes of one sign are ordered like their values, so a byte difference counts steps.
  steps = np.abs(bits(ours.codes_NK).astype(int) - bits(ckpt[BF16 + ".weight"]).astype(int))
  assert steps.max() == 1 and steps.mean() < 0.1


@pytest.mark.parametrize("layout", [MODELOPT, CT])
@pytest.mark.parametrize("per_channel", [False, True])
def test_write_read_round_trip(layout, per_channel):
  name = "model.layers.2.mlp.down_proj"
  w = fp8.quantize(dense_KN(CHANNEL), per_channel=per_channel)
  fmt = LinearFormat("fp8", layout, per_channel=per_channel)
  qc, hf = write_quant_config(layout, {name: fmt, "lm_head": None})
  s = parse_quant_config({"quantization_config": qc}, hf)
  ckpt = write_linear(s, name, w)
  scale_shape = {
    (MODELOPT, False): (),
    (CT, False): (1,),
    (MODELOPT, True): (32,),
    (CT, True): (32, 1),
  }
  assert ckpt[name + ".weight_scale"].shape == scale_shape[layout, per_channel]
  assert ckpt[name + ".weight"].dtype == E4M3 and ckpt[name + ".weight"].shape == (32, 64)
  back = read_linear(s, name, getter(ckpt))
  np.testing.assert_array_equal(bits(back.codes_NK), bits(w.codes_NK))
  np.testing.assert_array_equal(np.asarray(back.scale_N), np.asarray(w.scale_N))


def test_fused_projection_keeps_one_scale_per_shard():
  rng = np.random.default_rng(0)
  shards = [
    fp8.quantize(rng.normal(size=(64, n)).astype(np.float32) * s) for n, s in [(8, 1), (16, 9)]
  ]
  fused = fp8.concat_columns(shards)
  assert fused.shape == (64, 24) and len(np.unique(np.asarray(fused.scale_N))) == 2
  np.testing.assert_array_equal(
    fused.dequantize(jnp.float32),
    jnp.concatenate([w.dequantize(jnp.float32) for w in shards], axis=1),
  )
  s = parse_quant_config(
    {"quantization_config": write_quant_config(CT, {"p": LinearFormat("fp8", CT)})[0]}
  )
  with pytest.raises(QuantFormatError, match=r"^p: the scale .*per-tensor"):
    write_linear(s, "p", fused)
  back = read_linear(s, "p", getter(write_linear(s, "p", fused.columns(8, 24))))
  np.testing.assert_array_equal(back.dequantize(jnp.float32), shards[1].dequantize(jnp.float32))


def bad_reads():
  ckpt = quant_tensors("ct_model.safetensors")
  good = {k: v for k, v in ckpt.items() if k.startswith(TENSOR + ".")}
  w, s = good[TENSOR + ".weight"], good[TENSOR + ".weight_scale"]
  return {
    "block scales": (
      {TENSOR + ".weight_scale": np.ones((1, 2), np.float32)},
      "weight_scale",
      "block",
    ),
    "channel scale, tensor config": (
      {TENSOR + ".weight_scale": np.ones((32, 1), np.float32)},
      "weight_scale",
      "per-channel .* config says per-tensor",
    ),
    "int8 codes": ({TENSOR + ".weight": w.view(np.int8)}, "weight", "float8_e4m3fn"),
    "codes, no scale": ({TENSOR + ".weight_scale": None}, "weight_scale", "missing"),
    "e4m3 scale": ({TENSOR + ".weight_scale": s.astype(E4M3)}, "weight_scale", "float scale"),
    "inf scale": (
      {TENSOR + ".weight_scale": np.array([np.inf], np.float32)},
      "weight_scale",
      "finite",
    ),
    "1-d codes": ({TENSOR + ".weight": w.reshape(-1)}, "weight", r"\[out, in\]"),
  }, good


@pytest.mark.parametrize("case", bad_reads()[0])
def test_bad_tensors_raise_naming_the_tensor(case):
  cases, good = bad_reads()
  change, tensor, why = cases[case]
  d = {**good, **change}
  d = {k: v for k, v in d.items() if v is not None}
  with pytest.raises(
    QuantFormatError, match=rf"model\.layers\.0\.self_attn\.q_proj\.{tensor}\b.*{why}"
  ):
    read_linear(scheme(), TENSOR, getter(d))


def test_wrong_shape_and_wrong_kind_are_refused():
  ckpt = quant_tensors("ct_model.safetensors")
  with pytest.raises(QuantFormatError, match=rf"{TENSOR}\.weight: .*\(64, 32\).*\(32, 64\)"):
    read_linear(scheme(), TENSOR, getter(ckpt), shape=(32, 64))
  nvfp4_name = "model.layers.0.mlp.gate_proj"
  with pytest.raises(QuantFormatError, match=rf"{nvfp4_name}: cannot write an fp8 weight"):
    write_linear(scheme(), nvfp4_name, fp8.quantize(np.ones((64, 8), np.float32)))


@pytest.mark.parametrize("per_channel", [False, True])
def test_quantizer_is_nan_safe(per_channel):
  rng = np.random.default_rng(1)
  w_KN = rng.normal(size=(64, 16)).astype(np.float32) * np.logspace(-3, 4, 16, dtype=np.float32)
  w_KN[:, 2] = 0.0
  for w in (w_KN, np.zeros_like(w_KN)):
    q = fp8.quantize(w, per_channel=per_channel)
    deq = np.asarray(q.dequantize(jnp.float32))
    assert np.all(np.isfinite(deq)) and np.all(np.asarray(q.scale_N) > 0)
  amax = np.abs(w_KN).max(0) if per_channel else np.abs(w_KN).max()
  # e4m3 keeps 3 mantissa bits (relative error <= 1/16) down to 2^-6 * scale, then steps of 2^-9.
  q = fp8.quantize(w_KN, per_channel=per_channel)
  err = np.abs(np.asarray(q.dequantize(jnp.float32)) - w_KN)
  assert np.all(err <= np.abs(w_KN) / 16 + 2**-10 * amax / 448)
  assert np.all(np.asarray(q.dequantize(jnp.float32))[:, 2] == 0)


def test_matmul_is_x_times_dequantized_weight():
  w = fp8.quantize(
    np.random.default_rng(2).normal(size=(64, 24)).astype(np.float32), per_channel=True
  )
  assert isinstance(w, QuantizedWeight)
  x = jnp.asarray(np.random.default_rng(3).normal(size=(5, 64)), jnp.float32)
  y = matmul(x, w)
  assert y.shape == (5, 24)
  np.testing.assert_array_equal(y, x @ w.dequantize(x.dtype))
  # Under jit XLA may fuse the dequant into the dot and sum in another order.
  np.testing.assert_allclose(jax.jit(matmul)(x, w), y, rtol=1e-5, atol=1e-5)
