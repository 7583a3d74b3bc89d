"""EXL3 checkpoint IO: the fixture checkpoint, write -> read round trips, and format errors."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from specdec.quant.exl3 import (
  Codebook,
  EXL3Config,
  EXL3FormatError,
  EXL3Weight,
  parse_quantization_config,
  quantization_config,
  read_linear,
  write_linear,
)
from tests.helpers import with_changes

FIXTURE = Path(__file__).parents[1] / "fixtures" / "exl3"
P = "model.layers.7.mlp.up_proj"


def _read_file(path, prefix, **kw):
  with safe_open(str(path), framework="numpy") as f:
    names = set(f.keys())
    return read_linear(prefix, f.get_tensor, names.__contains__, **kw)


def test_fixture_checkpoint_decodes_to_the_oracle_values():
  config = json.loads((FIXTURE / "config.json").read_text())
  qc = parse_quantization_config(config)
  assert qc.bits == 4.67 and qc.head_bits == 8 and qc.codebook == Codebook.MUL1
  expected = np.load(FIXTURE / "expected.npz")
  codebooks = {"model.layers.0.mlp.down_proj": (Codebook.INST3, 1)}
  codebooks |= {"model.layers.0.self_attn.q_proj": (Codebook.MCG, 5), "lm_head": (Codebook.MUL1, 8)}
  for prefix, dims in config["layers"].items():
    w = _read_file(FIXTURE / "tiny.safetensors", prefix, **dims)
    assert (w.codebook, w.bits) == codebooks[prefix]
    assert w.shape == (dims["in_features"], dims["out_features"])
    rows, cols = expected[f"{prefix}:rows"], expected[f"{prefix}:cols"]
    inner, dense = np.asarray(w.inner()), np.asarray(w.dequantize(jnp.float32), np.float64)
    np.testing.assert_array_equal(inner[rows, cols], expected[f"{prefix}:inner"])
    assert inner.sum(dtype=np.float64) == pytest.approx(float(expected[f"{prefix}:inner_sum"]))
    want = expected[f"{prefix}:dense"]
    np.testing.assert_allclose(dense[rows, cols], want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert dense.sum() == pytest.approx(float(expected[f"{prefix}:dense_sum"]), rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("codebook", list(Codebook))
def test_write_read_round_trip_is_bit_exact(tmp_path, codebook):
  rng = np.random.default_rng(3)
  w = EXL3Weight(
    trellis=jnp.asarray(rng.integers(-(2**15), 2**15, (8, 16, 32)), jnp.int16),
    suh=jnp.asarray(rng.normal(size=128), jnp.float16),
    svh=jnp.asarray(rng.normal(size=256), jnp.float16),
    bias=jnp.asarray(rng.normal(size=256), jnp.float32),
    codebook=codebook,
    in_features=128,
    out_features=200,
  )
  tensors = write_linear(P, w)
  assert {n.removeprefix(P + ".") for n in tensors} == {"trellis", "suh", "svh", "bias"} | (
    set() if codebook == Codebook.INST3 else {str(codebook)}
  )
  save_file(tensors, str(tmp_path / "m.safetensors"))
  back = _read_file(tmp_path / "m.safetensors", P, in_features=128, out_features=200)
  assert back.codebook == codebook and back.shape == w.shape
  for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(back), strict=True):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)


def test_multiplier_tensor_is_what_exllamav3_saves():
  w = EXL3Weight(jnp.zeros((8, 8, 16), jnp.int16), jnp.ones(128, jnp.float16),
                 jnp.ones(128, jnp.float16), None, Codebook.MUL1, 128, 128)  # fmt: skip
  mul1 = write_linear(P, w)[f"{P}.mul1"]
  assert mul1.dtype == np.int32 and mul1.shape == () and int(mul1) == -2082680531


def _good_tensors(bits=2, n_in=128, n_out=256):
  return {
    f"{P}.trellis": np.zeros((n_in // 16, n_out // 16, 16 * bits), np.int16),
    f"{P}.suh": np.ones(n_in, np.float16),
    f"{P}.svh": np.ones(n_out, np.float16),
  }


def _with(**changes):
  return with_changes(_good_tensors(), P, changes)


BAD = {
  "trellis last dim not 16K": (_with(trellis=np.zeros((8, 16, 40), np.int16)), "trellis", "16*K"),
  "trellis K = 9": (_with(trellis=np.zeros((8, 16, 144), np.int16)), "trellis", "16*K"),
  "trellis not int16": (_with(trellis=np.zeros((8, 16, 32), np.int32)), "trellis", "int16"),
  "trellis rank 2": (_with(trellis=np.zeros((8, 512), np.int16)), "trellis", "shape"),
  "suh wrong length": (_with(suh=np.ones(120, np.float16)), "suh", "(128,)"),
  "svh wrong length": (_with(svh=np.ones(128, np.float16)), "svh", "(256,)"),
  "suh not f16": (_with(suh=np.ones(128, np.float32)), "suh", "float16"),
  "unknown multiplier": (_with(mcg=np.array(12345, np.int32)), "mcg", "unknown multiplier"),
  "both multipliers": (
    _with(mcg=np.array(-877912083, np.int32), mul1=np.array(-2082680531, np.int32)),
    "mcg",
    "both",
  ),
  "in not padded to 128": (
    {**_good_tensors(n_in=144), f"{P}.suh": np.ones(144, np.float16)},
    "trellis",
    "multiple of 128",
  ),
  "legacy packed signs": (_with(suh=None, su=np.zeros(8, np.int16)), "su", "legacy"),
  "missing svh": (_with(svh=None), "svh", "missing"),
  "bias wrong length": (_with(bias=np.zeros(100, np.float16)), "bias", "(256,)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_format_errors_name_the_tensor(case):
  tensors, suffix, phrase = BAD[case]
  with pytest.raises(EXL3FormatError) as info:
    read_linear(P, tensors.__getitem__, tensors.__contains__)
  assert f"{P}.{suffix}" in str(info.value) and phrase in str(info.value)
  assert isinstance(info.value, ValueError)


def test_shapes_must_be_the_config_dims_padded():
  tensors = _good_tensors(n_in=256)
  tensors[f"{P}.suh"] = np.ones(256, np.float16)
  with pytest.raises(EXL3FormatError, match=rf"{P}\.trellis: in dimension 256 .*in_features=100"):
    read_linear(P, tensors.__getitem__, tensors.__contains__, in_features=100, out_features=256)
  with pytest.raises(EXL3FormatError, match=rf"{P}\.trellis: out dimension 256 .*out_features=100"):
    read_linear(P, tensors.__getitem__, tensors.__contains__, in_features=256, out_features=100)
  w = read_linear(P, tensors.__getitem__, tensors.__contains__, in_features=200, out_features=129)
  assert w.shape == (200, 129) and w.padded_shape == (256, 256)


@pytest.mark.parametrize(
  ("qc", "key"),
  [
    ({"quant_method": "gptq", "bits": 4}, "quantization_config.quant_method"),
    ({"quant_method": "exl3"}, "quantization_config.bits"),
    ({"quant_method": "exl3", "bits": 3, "codebook": "e8p"}, "quantization_config.codebook"),
    ({"quant_method": "exl3", "bits": 3, "out_scales": "yes"}, "quantization_config.out_scales"),
  ],
)
def test_config_errors_name_the_key(qc, key):
  with pytest.raises(EXL3FormatError, match=key):
    parse_quantization_config({"quantization_config": qc})


def test_config_round_trip_keeps_unknown_keys():
  qc = {"quant_method": "exl3", "version": "0.0.18", "bits": 3.0, "head_bits": 6}
  qc |= {"codebook": "mcg", "out_scales": "auto", "original_quantization_config": {"a": 1}}
  cfg = parse_quantization_config({"model_type": "llama", "quantization_config": qc})
  assert cfg.codebook == Codebook.MCG and cfg.extra == {"original_quantization_config": {"a": 1}}
  assert quantization_config(cfg) == qc
  assert quantization_config(EXL3Config(bits=2.5))["quant_method"] == "exl3"
  with pytest.raises(EXL3FormatError, match="no quantization_config"):
    parse_quantization_config({"model_type": "llama"})
