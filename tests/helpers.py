"""Small shared builders and checks for tests."""

import dataclasses
import functools
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np

from kernels_pallas.bench_util import rel_err
from specdec.checkpoint.safetensors_io import read_tensors
from specdec.model import Model
from specdec.models.config import from_hf_dict

GOLDEN = "tests/fixtures/golden"
QUANT_FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "quant"


def copied_checkpoint(source: str, tmp_path) -> str:
  """A checkpoint directory copied under tmp_path, for tests that edit its files."""
  path = str(tmp_path / "m")
  shutil.copytree(source, path)
  return path


def tiny_config(**kw):
  d = dict(
    model_type="qwen3",
    vocab_size=64,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
  )
  d.update(kw)
  return from_hf_dict(d)


def tiny_model(seed=0, scale=10.0, **kw) -> Model:
  """Random weights scaled up so argmax gaps are wide and greedy text is not a constant."""
  return Model.random(tiny_config(**kw), seed=seed, scale=scale)


def random_exl3(model, bits: int = 4) -> Model:
  """`model` with EXL3 kernels of random codes where quantize_model puts EXL3 ones: quantizing
  even small matrices (the Viterbi search) takes minutes on a CPU."""
  from flax.traverse_util import flatten_dict, unflatten_dict

  from specdec.quant import exl3
  from specdec.quant.exl3.hadamard import HAD_DIM
  from specdec.quant.exl3.layout import pad_to

  flat = flatten_dict(model.params["params"])
  for i, (path, w) in enumerate(sorted(flat.items())):
    if path[-1] == "kernel" and path[0] != "lm_head":
      k, n = w.shape
      r = exl3.random_weight(jax.random.key(i), pad_to(k, HAD_DIM), pad_to(n, HAD_DIM), bits)
      flat[path] = dataclasses.replace(r, in_features=k, out_features=n)
  return dataclasses.replace(model, params={"params": unflatten_dict(flat)})


def result_row(**over):
  """A complete, valid sweep result row (specdec.lab.results schema) with `over` applied."""
  row = {
    "method": "ngram",
    "k": 2,
    "workload": "humaneval",
    "prompt_tokens": 512,
    "ctx_bucket": "[512,1024)",
    "temperature": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "acceptance": "greedy",
    "target_format": "bf16",
    "kv_dtype": "bfloat16",
    "batch": 1,
    "seed": 0,
    "leg": 0,
    "device": "cpu",
    "jax_version": "0.11.2",
    "git_commit": "unknown",
    "timestamp": "2026-12-01T00:00:00+00:00",
    "gate_passed": True,
  }
  row.update(over)
  return row


@functools.cache
def quant_tensors(name: str) -> dict[str, np.ndarray]:
  return read_tensors(str(QUANT_FIXTURES / name))


@functools.cache
def _dense_of() -> dict[str, str]:
  raw = (QUANT_FIXTURES / "ct_reference.safetensors").read_bytes()
  header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
  return json.loads(header["__metadata__"]["fixture"])["dense_of"]


def dense_KN(module: str) -> np.ndarray:
  """The original weight of a quant fixture's module, (in, out)."""
  return quant_tensors("ct_reference.safetensors")[_dense_of()[module] + ".dense"].T


def with_changes(tensors: dict, prefix: str, changes: dict) -> dict:
  """A copy of a checkpoint's `tensors` with each `prefix.suffix` of `changes` set to its value,
  or dropped where the value is None."""
  out = dict(tensors)
  for suffix, value in changes.items():
    if value is None:
      out.pop(f"{prefix}.{suffix}")
    else:
      out[f"{prefix}.{suffix}"] = value
  return out


def ref_f32(x, w):
  """x @ w for a quantized w, in f32 at full precision from its f32 dequantization."""
  return np.asarray(jnp.dot(x.astype(jnp.float32), w.dequantize(jnp.float32), precision="highest"))


def check_falls_back_to_xla(matmul, reference, w, tol):
  """On a CPU a GEMV kernel's `matmul` takes XLA's path: for x [4, K] a bf16 result within `tol`
  of `ref_f32`, as is `reference`'s. Returns x."""
  x = jax.random.normal(jax.random.key(0), (4, w.shape[0]), jnp.bfloat16)
  y = matmul(x, w)
  assert y.dtype == jnp.bfloat16
  assert rel_err(y, ref_f32(x, w)) < tol
  assert rel_err(reference(x, w), ref_f32(x, w)) < tol
  return x


def check_lowers_to_mosaic_gpu(matmul, w, m, k):
  """matmul(x [m, k] bf16, w), exported for cuda from any host, is a Mosaic GPU custom call."""
  x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
  text = jax.export.export(jax.jit(matmul), platforms=["cuda"])(x, w).mlir_module()
  assert "mosaic_gpu" in text


def hybrid_hf_dict(**kw) -> dict:
  """A small Qwen3-Next config.json: Gated DeltaNet then gated attention, routed experts with a
  shared expert on the second layer of each pair; `kw` overrides the keys (None drops one)."""
  d = dict(
    model_type="qwen3_next",
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    layer_types=["linear_attention", "full_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=16,
    decoder_sparse_step=2,
  )
  d.update(kw)
  return {key: v for key, v in d.items() if v is not None}


def tiny_hybrid_config(**kw):
  return from_hf_dict(hybrid_hf_dict(**kw))


def tiny_hybrid_model(seed=0, scale=3.0, **kw) -> Model:
  return Model.random(tiny_hybrid_config(**kw), seed=seed, scale=scale)


def lowerings_of(monkeypatch, name: str, fn, *args) -> int:
  """How many times lowering `fn(*args)` lowers the jitted function called `name` to a function
  (jax lowers a nested jit once per module and reuses it at every call site)."""
  from jax._src import pjit  # the one place jax lowers a nested jit

  count, lower = [0], pjit._pjit_lower_jaxpr_to_fun

  def counted(ctx, fn_name, *a, **kw):
    count[0] += fn_name == name
    return lower(ctx, fn_name, *a, **kw)

  jax.clear_caches()
  monkeypatch.setattr(pjit, "_pjit_lower_jaxpr_to_fun", counted)
  jax.jit(fn).lower(*args)
  return count[0]
