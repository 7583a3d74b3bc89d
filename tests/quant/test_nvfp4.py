"""NVFP4: golden files from compressed-tensors and ModelOpt, both layouts, configs, bad inputs."""

import functools
import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from specdec.ops.qmatmul import matmul
from specdec.quant import nvfp4
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
from tests.helpers import QUANT_FIXTURES, dense_KN, quant_tensors, with_changes

PREFIX = r"model\.layers\.0\.mlp\.gate_proj"
E4M3 = ml_dtypes.float8_e4m3fn
MODULES = {  # module -> the fixture matrix it holds
  "model.layers.0.mlp.gate_proj": "f32; torch's 2688/amax is not the true quotient here",
  "model.layers.0.mlp.up_proj": "f32 with values on every E2M1 rounding midpoint, -0.0, tiny -x",
  "model.layers.0.mlp.down_proj": "f32 rows from 1e-4 to 1e4, an all-zero block",
  "model.layers.1.mlp.gate_proj": "bf16",
}
F32_MODULES = list(MODULES)[:3]


@functools.cache
def config(name: str) -> dict:
  return json.loads((QUANT_FIXTURES / name).read_text())


def ct_scheme():
  return parse_quant_config(config("ct_config.json"))


def mo_scheme():
  return parse_quant_config(config("mo_config.json"), config("mo_hf_quant_config.json"))


def getter(d: dict):
  return lambda name: d[name]


def bits(a) -> np.ndarray:
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


# ------------------------------------------------------------------------ golden dequant / quantize


@pytest.mark.parametrize("module", MODULES)
def test_dequant_equals_compressed_tensors_bit_for_bit(module):
  w = read_linear(ct_scheme(), module, getter(quant_tensors("ct_model.safetensors")))
  assert isinstance(w, nvfp4.NVFP4Weight) and w.global_divides
  ref = quant_tensors("ct_reference.safetensors")
  np.testing.assert_array_equal(
    bits(w.dequantize(jnp.float32).T), bits(ref[module + ".dequant_f32"])
  )
  if module + ".dequant" in ref:  # decompress(): their bf16 model weights
    np.testing.assert_array_equal(
      bits(w.dequantize(jnp.bfloat16).T), bits(ref[module + ".dequant"])
    )


def test_dequant_equals_modelopt_bit_for_bit():
  module = "model.layers.0.mlp.gate_proj"
  w = read_linear(mo_scheme(), module, getter(quant_tensors("mo_model.safetensors")))
  assert not w.global_divides
  ref = quant_tensors("mo_reference.safetensors")[module + ".dequant_f32"]
  ours = np.asarray(w.dequantize(jnp.float32).T)
  # ModelOpt decodes code 8 as +0.0 where compressed-tensors (and we, and JAX's float4) give -0.0.
  np.testing.assert_array_equal(bits(ours + 0.0), bits(ref))


def check_quantizer(checkpoint: str, module: str, convention: str, codes: str):
  """Quantizing the module's original weight by `convention` gives the checkpoint's codes (named
  module.`codes`) and block scales, bit for bit. Returns the quantized weight and the checkpoint."""
  ckpt = quant_tensors(checkpoint)
  q = nvfp4.quantize(dense_KN(module), convention=convention)
  np.testing.assert_array_equal(np.asarray(q.packed_NP), ckpt[f"{module}.{codes}"])
  np.testing.assert_array_equal(bits(q.scales_NG), bits(ckpt[module + ".weight_scale"]))
  return q, ckpt


@pytest.mark.parametrize("module", F32_MODULES)
def test_quantizer_reproduces_compressed_tensors(module):
  q, ckpt = check_quantizer("ct_model.safetensors", module, "compressed-tensors", "weight_packed")
  np.testing.assert_array_equal(
    bits(q.global_scale_N[:1]), bits(ckpt[module + ".weight_global_scale"])
  )


@pytest.mark.parametrize("module", MODULES)
def test_quantizer_reproduces_modelopt(module):
  # ModelOpt computes in f32 even for bf16 weights, so the bf16 matrix matches too.
  q, ckpt = check_quantizer("mo_model.safetensors", module, "modelopt", "weight")
  assert np.float32(q.global_scale_N[0]) == ckpt[module + ".weight_scale_2"]


def test_bf16_weights_differ_from_compressed_tensors_only_by_its_bf16_intermediates():
  """compressed-tensors computes 2688/amax and blockamax/6 in the weight's dtype (bf16) and torch
  evaluates `2688 / t` as reciprocal(t) * 2688; we compute in f32. Emulating those roundings
  reproduces its scales exactly, and the remaining gap is bounded."""
  module = "model.layers.1.mlp.gate_proj"
  ckpt = quant_tensors("ct_model.safetensors")
  w_NK = dense_KN(module).T
  bf16, f32 = ml_dtypes.bfloat16, np.float32
  amax = np.abs(w_NK).max()
  their_g = ckpt[module + ".weight_global_scale"][0]
  assert ((f32(1) / f32(amax)).astype(bf16) * bf16(2688)).astype(f32) == their_g
  blockmax_NG = np.abs(w_NK.astype(f32)).reshape(w_NK.shape[0], -1, 16).max(-1)
  emulated_NG = (their_g * (blockmax_NG / f32(6)).astype(bf16).astype(f32)).astype(E4M3)
  their_scales = ckpt[module + ".weight_scale"]
  np.testing.assert_array_equal(bits(emulated_NG), bits(their_scales))

  # Given their global scale, block scales differ only where bf16(blockmax/6) moved the e4m3
  # rounding, by one e4m3 step; codes are identical in every other block.
  q = nvfp4.quantize(w_NK.T, convention="compressed-tensors", global_scale=their_g)
  ours = bits(q.scales_NG).astype(int)
  step = np.abs(ours - bits(their_scales).astype(int))
  assert step.max() <= 1 and 0 < step.sum() <= 0.05 * step.size
  same_N = (step == 0).repeat(8, axis=1)  # 8 bytes per 16-element block
  np.testing.assert_array_equal(
    np.asarray(q.packed_NP)[same_N], ckpt[module + ".weight_packed"][same_N]
  )
  # Without it, the global scales differ by their two bf16 roundings (< 2^-7 relative).
  g = float(nvfp4.quantize(w_NK.T, convention="compressed-tensors").global_scale_N[0])
  assert abs(g / their_g - 1) < 2**-7


# --------------------------------------------------------------------------------- E2M1 and packing


def test_e2m1_rounds_to_nearest_even_and_saturates():
  y = jnp.array(
    [0.25, 0.26, 0.75, 1.25, 1.26, 1.75, 2.5, 2.6, 3.5, 5.0, 5.1, 7.0, 1e30, -0.1, -0.0]
  )
  codes = np.asarray(nvfp4.e2m1_codes(y))
  np.testing.assert_array_equal(codes, [0, 1, 2, 2, 3, 4, 4, 5, 6, 6, 7, 7, 7, 8, 0])
  # JAX's own float4 cast agrees on every value except the sign of -0.0.
  jax_codes = jax.lax.bitcast_convert_type(y.astype(jnp.float4_e2m1fn), jnp.uint4)
  np.testing.assert_array_equal(codes[:-1], np.asarray(jax_codes.astype(jnp.uint8))[:-1])


def test_low_nibble_is_the_even_element():
  packed = nvfp4.pack_codes(jnp.array([[1, 2, 15, 8]], jnp.uint8))
  np.testing.assert_array_equal(np.asarray(packed), [[0x21, 0x8F]])
  codes = np.random.default_rng(0).integers(0, 16, (5, 64), dtype=np.uint8)
  packed = nvfp4.pack_codes(codes)
  np.testing.assert_array_equal(np.asarray(nvfp4.unpack_codes(packed)), codes)
  # XLA's bitcast to float4 (an independent unpacker) reads the same element order.
  vals = jax.lax.bitcast_convert_type(packed, jnp.float4_e2m1fn).reshape(5, 64)
  np.testing.assert_array_equal(np.asarray(vals.astype(jnp.float32)), nvfp4.E2M1_VALUES[codes])


def test_kernel_bit_order_keeps_every_code():
  codes = np.random.default_rng(2).integers(0, 16, (6, 128), dtype=np.uint8)
  packed = nvfp4.pack_codes(codes)
  kernel = nvfp4.reorder_bits(packed, "checkpoint", "kernel")
  assert kernel.shape == packed.shape and not np.array_equal(kernel, packed)
  np.testing.assert_array_equal(nvfp4.unpack_codes(kernel, "kernel"), codes)
  np.testing.assert_array_equal(nvfp4.reorder_bits(kernel, "kernel", "checkpoint"), packed)
  # One code per position: its sign lands at bit 15 (31) and magnitude at [8:6] ([24:22]) after
  # the pair's shifts, which is what the kernel's decode relies on.
  for j in range(8):
    one = np.zeros((1, 4), np.uint8)
    one.view(np.uint32)[0, 0] = np.uint32(0xF) << np.uint32(4 * j)
    word = int(np.asarray(nvfp4.reorder_bits(one, "checkpoint", "kernel")).view(np.uint32)[0, 0])
    sign, mag = nvfp4.PAIR_SHIFTS["kernel"][j % 4]
    shift = lambda v, s: (v << s) & 0xFFFFFFFF if s >= 0 else v >> -s  # noqa: E731
    base = 16 * (j // 4)
    assert shift(word, sign) & (1 << (base + 15))
    assert shift(word, mag) & (0x1C0 << base) == 0x1C0 << base


def test_kernel_order_weight_dequantizes_and_saves_as_the_checkpoint_order():
  w = nvfp4.quantize(dense_KN(F32_MODULES[0]))
  wk = w.in_order("kernel")
  assert wk.bit_order == "kernel" and wk.in_order("kernel") is wk
  np.testing.assert_array_equal(bits(wk.dequantize(jnp.float32)), bits(w.dequantize(jnp.float32)))
  np.testing.assert_array_equal(
    bits(wk.columns(8, 24).dequantize(jnp.float32)), bits(w.columns(8, 24).dequantize(jnp.float32))
  )
  fmt = LinearFormat("nvfp4", MODELOPT)
  qc, hf = write_quant_config(MODELOPT, {"m": fmt})
  scheme = parse_quant_config({"quantization_config": qc}, hf)
  np.testing.assert_array_equal(
    write_linear(scheme, "m", wk)["m.weight"], write_linear(scheme, "m", w)["m.weight"]
  )
  with pytest.raises(QuantFormatError, match="bit orders"):
    nvfp4.concat_columns([w, wk])
  assert nvfp4.for_device({"a": w})["a"] is w  # the CPU keeps the checkpoint's order


# ------------------------------------------------------------------------------- layouts round trip


def quantized_model() -> dict[str, nvfp4.NVFP4Weight]:
  rng = np.random.default_rng(1)
  return {
    f"model.layers.0.self_attn.{p}": nvfp4.quantize(rng.normal(size=(64, n)).astype(np.float32) * s)
    for p, n, s in [("q_proj", 48, 0.02), ("k_proj", 16, 0.5), ("v_proj", 16, 3.0)]
  }


@pytest.mark.parametrize("layout", [MODELOPT, CT])
@pytest.mark.parametrize("convention", ["modelopt", "compressed-tensors"])
def test_write_read_round_trip(layout, convention):
  ws = {
    name: nvfp4.quantize(dense_KN(m), convention=convention)
    for name, m in [("model.layers.0.mlp.gate_proj", F32_MODULES[0]), ("mtp.fc", F32_MODULES[1])]
  }
  fmt = LinearFormat("nvfp4", layout)
  qc, hf = write_quant_config(layout, {**{n: fmt for n in ws}, "lm_head": None})
  scheme = parse_quant_config({"quantization_config": qc}, hf)
  ckpt = {}
  for name, w in ws.items():
    ckpt.update(write_linear(scheme, name, w))
  lm_head_KN = np.ones((64, 8), ml_dtypes.bfloat16)
  ckpt.update(write_linear(scheme, "lm_head", lm_head_KN))
  names = {"modelopt": {"weight", "weight_scale", "weight_scale_2"}}
  names[CT] = {"weight_packed", "weight_scale", "weight_global_scale"}
  assert {k.split(".")[-1] for k in ckpt if k.startswith("mtp.fc.")} == names[layout]
  for name, w in ws.items():
    back = read_linear(scheme, name, getter(ckpt), shape=w.shape)
    np.testing.assert_array_equal(np.asarray(back.packed_NP), np.asarray(w.packed_NP))
    np.testing.assert_array_equal(bits(back.scales_NG), bits(w.scales_NG))
    if back.global_divides == w.global_divides:
      np.testing.assert_array_equal(
        bits(back.dequantize(jnp.float32)), bits(w.dequantize(jnp.float32))
      )
    else:  # stored as 1/g: one f32 rounding of the global scale
      np.testing.assert_allclose(back.dequantize(jnp.float32), w.dequantize(jnp.float32), rtol=3e-7)
  np.testing.assert_array_equal(read_linear(scheme, "lm_head", getter(ckpt)), lm_head_KN)


def test_fused_projection_keeps_one_global_scale_per_shard():
  shards = quantized_model()
  fused = nvfp4.concat_columns(list(shards.values()))
  assert fused.shape == (64, 80)
  assert len(np.unique(np.asarray(fused.global_scale_N))) == 3
  np.testing.assert_array_equal(
    fused.dequantize(jnp.float32),
    jnp.concatenate([w.dequantize(jnp.float32) for w in shards.values()], 1),
  )
  qc, hf = write_quant_config(MODELOPT, {n: LinearFormat("nvfp4", MODELOPT) for n in shards})
  scheme = parse_quant_config({"quantization_config": qc}, hf)
  with pytest.raises(QuantFormatError, match=r"model\.layers\.0\.self_attn\.q_proj.*shard"):
    write_linear(scheme, "model.layers.0.self_attn.q_proj", fused)
  ckpt = write_linear(scheme, "model.layers.0.self_attn.k_proj", fused.columns(48, 64))
  k = read_linear(scheme, "model.layers.0.self_attn.k_proj", getter(ckpt))
  np.testing.assert_array_equal(
    k.dequantize(jnp.float32), shards["model.layers.0.self_attn.k_proj"].dequantize(jnp.float32)
  )


@pytest.mark.parametrize("scheme_of, ckpt_name", [(ct_scheme, "ct_model"), (mo_scheme, "mo_model")])
def test_unquantized_exceptions_read_dense(scheme_of, ckpt_name):
  scheme, ckpt = scheme_of(), quant_tensors(f"{ckpt_name}.safetensors")
  assert (
    scheme.format_for("mtp.fc").kind == "nvfp4"
  )  # the config claims it, the checkpoint has bf16
  assert scheme.format_for("lm_head") is None
  for module in ("mtp.fc", "lm_head"):
    w = read_linear(scheme, module, getter(ckpt))
    np.testing.assert_array_equal(w, ckpt[module + ".weight"].T)


# ------------------------------------------------------------------------------------------ configs


def test_parse_compressed_tensors_config_written_by_compressed_tensors():
  scheme = ct_scheme()
  f = scheme.format_for
  assert f("model.layers.0.mlp.up_proj") == LinearFormat("nvfp4", CT)
  assert f("model.layers.7.self_attn.q_proj") == LinearFormat("fp8", CT, activations="fp8")
  assert f("model.layers.7.self_attn.k_proj") == LinearFormat("fp8", CT, True, "fp8")
  assert f("model.layers.7.self_attn.o_proj") is None and f("lm_head") is None
  assert scheme.kv_cache == "FP8"


def test_parse_modelopt_configs_written_by_modelopt():
  for scheme in (mo_scheme(), parse_quant_config(config("mo_config.json"))):
    assert scheme.format_for("model.layers.3.self_attn.q_proj") == LinearFormat(
      "nvfp4", MODELOPT, activations="nvfp4"
    )
    assert scheme.format_for("mtp.layers.0.mlp.down_proj") is None  # "mtp.layers.0*"
    assert scheme.format_for("lm_head") is None and scheme.kv_cache == "FP8"


@pytest.mark.parametrize("layout", [MODELOPT, CT])
def test_config_writer_round_trip_mixed_precision(layout):
  formats = {
    "model.layers.0.mlp.down_proj": LinearFormat("nvfp4", layout),
    "model.layers.0.self_attn.q_proj": LinearFormat("fp8", layout),
    "model.layers.0.self_attn.k_proj": LinearFormat("fp8", layout, per_channel=True),
    "lm_head": None,
  }
  qc, hf = write_quant_config(layout, formats, kv_cache="FP8")
  for scheme in [parse_quant_config({"quantization_config": qc}, hf), parse_quant_config(qc)]:
    for name, fmt in formats.items():
      got = scheme.format_for(name)
      assert (got and (got.kind, got.layout, got.per_channel)) == (
        fmt and (fmt.kind, layout, fmt.per_channel)
      )
    assert scheme.format_for("model.layers.0.mlp.up_proj") is None and scheme.kv_cache == "FP8"


def test_modelopt_exclude_globs_and_mixed_precision_prefixes():
  hf = {
    "quantization": {
      "quant_algo": "MIXED_PRECISION",
      "kv_cache_quant_algo": None,
      "exclude_modules": ["model.layers.1.*", "lm_head"],
      "quantized_layers": {
        "model.layers.0.mlp": {"quant_algo": "NVFP4", "group_size": 16},
        "model.layers.0.mlp.down_proj": {"quant_algo": "FP8"},
        "model.layers.1.mlp.up_proj": {"quant_algo": "NVFP4", "group_size": 16},
      },
    }
  }
  f = parse_quant_config({}, hf).format_for
  assert f("model.layers.0.mlp.up_proj").kind == "nvfp4"  # a parent prefix
  assert f("model.layers.0.mlp.down_proj").kind == "fp8"  # the longest prefix wins
  assert f("model.layers.1.mlp.up_proj") is None  # excluded first
  assert f("model.layers.0.self_attn.q_proj") is None  # not listed


# --------------------------------------------------------------------------------------- bad inputs


def ct_tensors(**replace):
  p = "model.layers.0.mlp.gate_proj"
  d = {k: v for k, v in quant_tensors("ct_model.safetensors").items() if k.startswith(p + ".")}
  return with_changes(d, p, replace)


def bad_reads():
  p = "model.layers.0.mlp.gate_proj"
  ckpt = quant_tensors("ct_model.safetensors")
  scales = ckpt[p + ".weight_scale"]
  packed = ckpt[p + ".weight_packed"]
  return {
    "group size 32": (ct_tensors(weight_scale=scales[:, :2]), "weight_scale", "groups of 16"),
    "f32 block scales": (
      ct_tensors(weight_scale=scales.astype(np.float32)),
      "weight_scale",
      "e4m3",
    ),
    "int8 codes": (ct_tensors(weight_packed=packed.view(np.int8)), "weight_packed", "uint8"),
    "in not /16": (ct_tensors(weight_packed=packed[:, :12]), "weight_packed", "multiple of 16"),
    "two global scales": (
      ct_tensors(weight_global_scale=np.ones(2, np.float32)),
      "weight_global_scale",
      "one global scale",
    ),
    "nan global": (
      ct_tensors(weight_global_scale=np.array([np.nan], np.float32)),
      "weight_global_scale",
      "finite",
    ),
    "nan block scale": (
      ct_tensors(weight_scale=np.full_like(scales, np.nan)),
      "weight_scale",
      "finite",
    ),
    "missing block scales": (ct_tensors(weight_scale=None), "weight_scale", "missing"),
    "zero point": (
      ct_tensors(weight_zero_point=np.zeros(1, np.float32)),
      "weight_zero_point",
      "asym",
    ),
  }


@pytest.mark.parametrize("case", bad_reads())
def test_bad_tensors_raise_naming_the_tensor_before_any_compile(case):
  d, tensor, why = bad_reads()[case]
  compiles = []

  def on_event(name, *args, **kwargs):
    if "backend_compile" in name:
      compiles.append(name)

  jax.monitoring.register_event_duration_secs_listener(on_event)
  try:
    with pytest.raises(QuantFormatError, match=rf"{PREFIX}\.{tensor}.*{why}"):
      read_linear(ct_scheme(), "model.layers.0.mlp.gate_proj", getter(d))
  finally:
    jax.monitoring.unregister_event_duration_listener(on_event)
  assert not compiles


def test_other_bad_inputs_name_the_tensor_or_key():
  p = "model.layers.0.mlp.gate_proj"
  good = ct_tensors()
  with pytest.raises(QuantFormatError, match=rf"{p}\.weight_packed.*\(64, 32\).*\(64, 64\)"):
    read_linear(ct_scheme(), p, getter(good), shape=(64, 64))
  with pytest.raises(
    QuantFormatError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight_packed.*unquantized"
  ):
    read_linear(parse_quant_config({}), p, getter(good))
  mo = write_linear(mo_scheme(), p, read_linear(ct_scheme(), p, getter(good)))
  del mo[p + ".weight_scale_2"]
  with pytest.raises(QuantFormatError, match=rf"{p}\.weight_scale_2: missing"):
    read_linear(mo_scheme(), p, getter(mo))
  with pytest.raises(QuantFormatError, match=r"in_features divisible by 16"):
    nvfp4.quantize(np.ones((24, 8), np.float32))


def test_modelopt_configs_that_disagree_are_refused():
  hf = config("mo_hf_quant_config.json")
  with pytest.raises(QuantFormatError, match=r"quant_algo: 'FP8' disagrees"):
    parse_quant_config(
      {"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}, hf
    )
  with pytest.raises(QuantFormatError, match=r"quant_method: 'compressed-tensors'"):
    parse_quant_config(config("ct_config.json"), hf)


@pytest.mark.parametrize(
  "qc, key",
  [
    ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "quant_algo"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}, "group_size"),
    ({"quant_method": "gptq"}, "quant_method"),
    (
      {
        "quant_method": "compressed-tensors",
        "config_groups": {
          "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "float", "group_size": 32},
          }
        },
      },
      r"config_groups\.group_0\.weights\.group_size",
    ),
    (
      {"quant_method": "compressed-tensors", "config_groups": {}, "transform_config": {"x": 1}},
      "transform_config",
    ),
  ],
)
def test_bad_configs_raise_naming_the_key(qc, key):
  with pytest.raises(QuantFormatError, match=key):
    parse_quant_config({"quantization_config": qc})


# ----------------------------------------------------------------------------- numerics and matmul


@pytest.mark.parametrize("convention", ["modelopt", "compressed-tensors"])
def test_quantizer_is_nan_safe(convention):
  rng = np.random.default_rng(2)
  w_KN = rng.normal(size=(64, 32)).astype(np.float32) * np.logspace(-3, 4, 32, dtype=np.float32)
  w_KN[:16, 3] = 0.0  # an all-zero block
  w_KN[:, 5] = 1e4  # a block at the maximum
  for w in (w_KN, np.zeros_like(w_KN), w_KN * 1e-30):
    q = nvfp4.quantize(w, convention=convention)
    deq = np.asarray(q.dequantize(jnp.float32))
    assert np.all(np.isfinite(deq)) and np.all(np.isfinite(np.asarray(q.global_scale_N)))
    assert not np.any(np.isnan(np.asarray(q.scales_NG).astype(np.float32)))
  err = np.abs(deq / 1e-30 - w_KN)
  blockmax = np.abs(w_KN).reshape(4, 16, 32).max(1).repeat(16, 0)
  # Half the widest E2M1 gap (1 of 6) plus the scale rounding; blocks more than 448 * 2^9 below the
  # maximum leave e4m3's range and keep only an absolute error of a few 1e-6 of the maximum.
  assert np.all(err <= blockmax / 5 + 3e-6 * np.abs(w_KN).max())
  assert np.all(deq[:16, 3] == 0)


def test_matmul_is_x_times_dequantized_weight():
  w = quantized_model()["model.layers.0.self_attn.q_proj"]
  assert isinstance(w, QuantizedWeight)
  x = jnp.asarray(np.random.default_rng(3).normal(size=(2, 3, 64)), jnp.bfloat16)
  y = matmul(x, w)
  assert y.dtype == jnp.bfloat16 and y.shape == (2, 3, 48)
  np.testing.assert_array_equal(bits(y), bits(x @ w.dequantize(x.dtype)))
  # Under jit XLA may fuse the dequant into the dot and sum in another order.
  y_jit = jax.jit(matmul)(x, w).astype(jnp.float32)
  np.testing.assert_allclose(y_jit, y.astype(jnp.float32), rtol=2e-2, atol=2e-2)
  leaves, treedef = jax.tree_util.tree_flatten(w)
  assert len(leaves) == 3 and jax.tree_util.tree_unflatten(treedef, leaves).global_divides is False
