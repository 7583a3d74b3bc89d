"""Load an HF-layout checkpoint directory into a `Model`, all or nothing.

Every tensor is read and checked (known name, shape, dtype) and the tokenizer is checked against
the embedding before anything is returned; the first problem raises one `CheckpointError` naming
the file and the tensor.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from specdec.checkpoint import names
from specdec.checkpoint.safetensors_io import (
  CheckpointError,
  checkpoint_files,
  read_tensors,
  write_tensors,
)
from specdec.models.config import ConfigError, ModelConfig, load_config, to_hf_dict
from specdec.models.transformer import KVCache, Transformer

FLOAT_SOURCE_DTYPES = ("float32", "float16", "bfloat16")
ACTIVATION_SCALES = (".input_scale", ".input_global_scale")


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
  """params path -> shape, from the module itself (no weights are allocated)."""
  module = Transformer(config, jnp.float32)
  tok = jnp.zeros((1, 1), jnp.int32)
  cache = jax.eval_shape(lambda: KVCache.zeros(config, 1, 1, jnp.float32))
  shapes = jax.eval_shape(module.init, jax.random.key(0), tok, tok, cache)["params"]
  return {"/".join(k): v.shape for k, v in flatten_dict(shapes).items()}


def _eos_ids(path: str, config: ModelConfig) -> tuple[int, ...]:
  file = os.path.join(path, "generation_config.json")
  if not os.path.exists(file):
    return config.eos_token_ids
  try:
    with open(file) as f:
      eos = json.load(f).get("eos_token_id")
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{file}: not valid JSON ({e})") from e
  if eos is None:
    return config.eos_token_ids
  return (eos,) if isinstance(eos, int) else tuple(eos)


def load_tokenizer(path: str, vocab_size: int):
  file = os.path.join(path, "tokenizer.json")
  if not os.path.exists(file):
    return None
  from tokenizers import Tokenizer

  try:
    tok = Tokenizer.from_file(file)
  except Exception as e:  # the tokenizers library raises plain Exception subclasses
    raise CheckpointError(f"{file}: cannot load tokenizer ({e})") from e
  n = tok.get_vocab_size(with_added_tokens=True)
  if n > vocab_size:
    raise CheckpointError(
      f"{file}: tokenizer has {n} tokens but the embedding has vocab_size={vocab_size}"
    )
  return tok


def linear_reader(path: str, raw_config: dict):
  """For a quantized checkpoint, `read(module, get, has, shape) -> weight`; else None.

  ModelOpt and compressed-tensors (NVFP4, FP8) go through `specdec.quant.layouts`; exllamav3
  (EXL3) through `specdec.quant.exl3`. Layers a scheme leaves dense come back as (in, out) arrays.
  """
  from specdec.quant import exl3, layouts

  qc = raw_config.get("quantization_config") or {}
  if qc.get("quant_method") == "exl3":
    exl3.parse_quantization_config(raw_config)

    def read_exl3(module, get, has, shape):
      if not has(f"{module}.trellis") and has(f"{module}.weight"):
        return np.asarray(get(f"{module}.weight")).T  # e.g. an lm_head kept at full precision
      return exl3.read_linear(module, get, has, in_features=shape[0], out_features=shape[1])

    return read_exl3
  hf_file = os.path.join(path, "hf_quant_config.json")
  hf = None
  if os.path.exists(hf_file):
    try:
      with open(hf_file) as f:
        hf = json.load(f)
    except json.JSONDecodeError as e:
      raise CheckpointError(f"{hf_file}: not valid JSON ({e})") from e
  if hf is None and not qc:
    return None
  scheme = layouts.parse_quant_config(raw_config, hf)
  return lambda module, get, has, shape: layouts.read_linear(scheme, module, get, shape=shape)


def read_params(path: str, config: ModelConfig, dtype, reader=None) -> dict:
  files = checkpoint_files(path)
  want = expected_shapes(config)
  arrays: dict[str, np.ndarray] = {}
  by_file: dict[str, list[str]] = {}
  for name, file in files.items():
    by_file.setdefault(file, []).append(name)
  for file, tensor_names in sorted(by_file.items()):
    arrays.update(read_tensors(file, tensor_names))
  found: dict = {}
  consumed: set[str] = set()
  if reader is not None:
    found, consumed = _read_quantized_linears(arrays, files, want, reader)
  for name, array in arrays.items():
    if name in consumed or names.is_ignored(name):
      continue
    if reader is not None and name.endswith(ACTIVATION_SCALES):
      continue  # weight-only execution (W4A16 / W8A16) reads no activation scales
    file = files[name]
    mapped = names.to_path(name)
    if mapped is None or (mapped[0] not in want and not _tied_head(mapped[0], config)):
      raise CheckpointError(
        f"{file}: unexpected tensor {name!r} for this {config.model_type} config"
      )
    target, transpose = mapped
    if target not in want:
      continue  # a tied checkpoint that also stores lm_head.weight
    if array.dtype.name not in FLOAT_SOURCE_DTYPES:
      raise CheckpointError(
        f"{file}: tensor {name!r} has dtype {array.dtype.name}; expected one of "
        f"{', '.join(FLOAT_SOURCE_DTYPES)}"
      )
    if transpose:
      array = array.T
    if array.shape != want[target]:
      shown = array.T.shape if transpose else array.shape
      expect = want[target][::-1] if transpose else want[target]
      raise CheckpointError(
        f"{file}: tensor {name!r} has shape {shown}, expected {expect} from config.json"
      )
    found[target] = array
  missing = sorted(set(want) - set(found))
  if missing:
    hf = names.to_hf_name(missing[0])[0]
    raise CheckpointError(f"{path}: missing tensor {hf!r} ({len(missing)} missing in all)")

  def to_device(v):
    if isinstance(v, np.ndarray):
      return jnp.asarray(v.astype(np.float32), dtype)
    return jax.tree.map(jnp.asarray, v)  # a quantized weight keeps its own dtypes

  return unflatten_dict({tuple(k.split("/")): to_device(v) for k, v in found.items()})


def _read_quantized_linears(arrays, files, want, reader):
  """Every Linear kernel through the quantization reader (dense where the scheme says so)."""
  from specdec.quant.errors import QuantFormatError

  found, consumed = {}, set()

  def get(name):
    consumed.add(name)
    return arrays[name]

  for path, shape in want.items():
    if not path.endswith("/kernel"):
      continue
    module = names.module_of(path)
    file = next((files[n] for n in files if n.startswith(module + ".")), "checkpoint")
    try:
      w = reader(module, get, lambda name: name in arrays, shape)
    except QuantFormatError as e:
      raise CheckpointError(f"{file}: {e}") from e
    except KeyError as e:
      raise CheckpointError(f"{file}: missing tensor {e}") from e
    if tuple(w.shape) != tuple(shape):
      raise CheckpointError(
        f"{file}: {module} has shape {tuple(w.shape)}, expected {tuple(shape)} (in, out)"
      )
    found[path] = w
  return found, consumed


def _tied_head(target: str, config: ModelConfig) -> bool:
  return target == "lm_head/kernel" and config.tie_word_embeddings


def load(path: str, dtype=jnp.bfloat16):
  """Loads config.json + safetensors (+ tokenizer.json, generation_config.json) from `path`."""
  from specdec.model import Model

  if not os.path.isdir(path):
    raise CheckpointError(f"{path}: not a directory")
  try:
    config = load_config(path)
  except ConfigError as e:
    raise CheckpointError(str(e)) from e
  with open(os.path.join(path, "config.json")) as f:
    reader = linear_reader(path, json.load(f))
  params = read_params(path, config, dtype, reader)
  tokenizer = load_tokenizer(path, config.vocab_size)
  config = config.replace(eos_token_ids=_eos_ids(path, config))
  return Model(config=config, params={"params": params}, tokenizer=tokenizer, dtype=dtype)


def save(path: str, model, dtype=None, layout: str = "modelopt") -> None:
  """Writes `model` in the HF layout this loader reads (config, safetensors, tokenizer).

  Quantized kernels (NVFP4 / FP8 weights) are written in `layout` ("modelopt" or
  "compressed-tensors") with the matching quantization config; dense ones as plain weights.
  """
  from specdec.quant import exl3, layouts
  from specdec.quant.matmul import QuantizedWeight
  from specdec.quant.nvfp4 import NVFP4Weight

  os.makedirs(path, exist_ok=True)
  flat = {"/".join(k): v for k, v in flatten_dict(model.params["params"]).items()}
  formats, exl3_bits = {}, []
  for key, value in flat.items():
    if isinstance(value, exl3.EXL3Weight):
      exl3_bits.append(value.bits)
    elif isinstance(value, QuantizedWeight):
      kind = "nvfp4" if isinstance(value, NVFP4Weight) else "fp8"
      formats[names.module_of(key)] = layouts.LinearFormat(kind, layout)
    elif key.endswith("/kernel"):
      formats[names.module_of(key)] = None
  quant_config = hf_quant = None
  if exl3_bits:
    quant_config = exl3.quantization_config(exl3.EXL3Config(bits=float(np.mean(exl3_bits))))
  elif any(formats.values()):
    quant_config, hf_quant = layouts.write_quant_config(layout, formats)
    scheme = layouts.parse_quant_config({"quantization_config": quant_config}, hf_quant)
  tensors = {}
  for key, value in flat.items():
    if isinstance(value, exl3.EXL3Weight):
      tensors.update(exl3.write_linear(names.module_of(key), value))
      continue
    if isinstance(value, QuantizedWeight):
      tensors.update(layouts.write_linear(scheme, names.module_of(key), value))
      continue
    name, transpose = names.to_hf_name(key)
    a = np.asarray(jnp.asarray(value, dtype or value.dtype))
    tensors[name] = np.ascontiguousarray(a.T if transpose else a)
  write_tensors(os.path.join(path, "model.safetensors"), tensors, {"format": "pt"})
  config = to_hf_dict(model.config)
  if quant_config:
    config["quantization_config"] = quant_config
  _write_json(os.path.join(path, "config.json"), config)
  if hf_quant:
    _write_json(os.path.join(path, "hf_quant_config.json"), hf_quant)
  if model.config.eos_token_ids:
    _write_json(
      os.path.join(path, "generation_config.json"),
      {"eos_token_id": list(model.config.eos_token_ids)},
    )
  if model.tokenizer is not None:
    model.tokenizer.save(os.path.join(path, "tokenizer.json"))


def _write_json(file: str, d: dict) -> None:
  with open(file, "w") as f:
    json.dump(d, f, indent=2)
