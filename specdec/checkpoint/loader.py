"""Load an HF-layout checkpoint directory into a `Model`, all or nothing.

Every tensor is read and checked (known name, shape, dtype) and the tokenizer is checked against
the embedding before anything is returned; the first problem raises one `CheckpointError` naming
the file and the tensor.

A vision-language wrapper (Qwen3.5 as published: `config.VL_WRAPPERS`) loads as its language
model alone: the config from `text_config`, the tensors from under `model.language_model.`; the
vision tower (`model.visual.*`) is not read, and `mtp.*` is left to `load_drafter` as in a text
checkpoint.

A checkpoint that declares an FP8 KV cache loads with its per-layer k/v scales in the attention
params and `kv_dtype` float8_e4m3fn; scales it does not ship are 1.0, with a warning naming them.
"""

import json
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from specdec import xla_env
from specdec.checkpoint import hybrid_names, names
from specdec.checkpoint.safetensors_io import (
  CheckpointError,
  checkpoint_files,
  read_tensors,
  write_tensors,
)
from specdec.models import fuse, stack
from specdec.models.config import (
  VL_WRAPPERS,
  ConfigError,
  HybridConfig,
  ModelConfig,
  load_config,
  to_hf_dict,
)
from specdec.ops.kv_cache import FP8, KV_SCALES
from specdec.quant import layouts, nvfp4
from specdec.quant.errors import QuantFormatError

FLOAT_SOURCE_DTYPES = ("float32", "float16", "bfloat16")
ACTIVATION_SCALES = (".input_scale", ".input_global_scale")


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
  """params path -> shape, from the module itself (no weights are allocated)."""
  module = stack.decoder(config, jnp.float32)
  tok = jnp.zeros((1, 1), jnp.int32)
  cache = jax.eval_shape(lambda: stack.empty_cache(config, 1, 1, jnp.float32))
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


def linear_reader(raw_config: dict, scheme: "layouts.QuantScheme | None"):
  """For a quantized checkpoint, `read(module, get, has, shape) -> weight`; else None.

  ModelOpt and compressed-tensors (NVFP4, FP8) go through `specdec.quant.layouts` with `scheme`
  (`quant_scheme`'s); exllamav3 (EXL3) through `specdec.quant.exl3`. Layers a scheme leaves dense
  come back as (in, out) arrays.
  """
  from specdec.quant import exl3

  qc = raw_config.get("quantization_config") or {}
  if qc.get("quant_method") == "exl3":
    exl3.parse_quantization_config(raw_config)

    def read_exl3(module, get, has, shape):
      if not has(f"{module}.trellis") and has(f"{module}.weight"):
        return np.asarray(get(f"{module}.weight")).T  # e.g. an lm_head kept at full precision
      return exl3.read_linear(module, get, has, in_features=shape[0], out_features=shape[1])

    return read_exl3
  if scheme is None:
    return None
  return lambda module, get, has, shape: layouts.read_linear(scheme, module, get, shape=shape)


def quant_scheme(path: str, raw_config: dict) -> "layouts.QuantScheme | None":
  """The ModelOpt / compressed-tensors scheme of a checkpoint (None: unquantized or EXL3)."""
  qc = raw_config.get("quantization_config") or {}
  if qc.get("quant_method") == "exl3":
    return None
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
  return layouts.parse_quant_config(raw_config, hf)


def tensor_prefix(raw_config: dict) -> str:
  """Where a checkpoint keeps the language model's tensors (`names.text_name`)."""
  if raw_config.get("model_type") in VL_WRAPPERS:
    return names.WRAPPER_PREFIX
  return names.TEXT_PREFIX


def read_params(
  path: str, config: ModelConfig, dtype, reader=None, scheme=None, prefix=names.TEXT_PREFIX
) -> tuple[dict, list[str]]:
  """(params, the FP8 KV scale tensors the checkpoint declares but lacks: they read as 1.0).
  prefix: where the language model's tensors sit (`tensor_prefix`); a wrapper's vision tower is
  not read."""
  files = checkpoint_files(path)
  if prefix != names.TEXT_PREFIX:
    files = {n: f for n, f in files.items() if not n.startswith(names.VISION_PREFIX)}
  want = expected_shapes(config)
  arrays: dict[str, np.ndarray] = {}
  by_file: dict[str, list[str]] = {}
  for name, file in files.items():
    by_file.setdefault(file, []).append(name)
  for file, tensor_names in sorted(by_file.items()):
    arrays.update(read_tensors(file, tensor_names))
  hybrid = isinstance(config, HybridConfig)
  if hybrid:
    arrays, files = hybrid_names.stack_experts(arrays, files, config, prefix)
    arrays, files = hybrid_names.fuse_split_gdn(arrays, files, config, prefix)
  found: dict = {}
  consumed: set[str] = set()
  if reader is not None:
    found, consumed = _read_quantized_linears(arrays, files, want, reader)
  kv_found, kv_read, kv_missing = _read_kv_scales(arrays, files, config, scheme)
  found.update(kv_found)
  consumed |= kv_read
  for name, array in arrays.items():
    text = names.text_name(name, prefix)
    if name in consumed or (text is not None and names.is_ignored(text)):
      continue
    if name.endswith(layouts.KV_SCALE_SUFFIXES):
      raise CheckpointError(f"{files[name]}: KV cache scale {name!r} {_kv_misfit(config, scheme)}")
    if reader is not None and name.endswith(ACTIVATION_SCALES):
      continue  # weight-only execution (W4A16 / W8A16) reads no activation scales
    file = files[name]
    if text is None:
      raise CheckpointError(
        f"{file}: unexpected tensor {name!r}: this vision-language wrapper keeps the language "
        f"model's tensors under {prefix!r}"
      )
    mapped = (hybrid_names.to_path if hybrid else names.to_path)(text)
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
    try:
      hf = names.stored_name(
        (hybrid_names.to_hf_name if hybrid else names.to_hf_name)(missing[0])[0], prefix
      )
    except KeyError:  # a stacked expert params path: name it as it is
      hf = missing[0]
    raise CheckpointError(f"{path}: missing tensor {hf!r} ({len(missing)} missing in all)")

  def to_device(key, v):
    if key.rsplit("/", 1)[-1] in KV_SCALES:
      return jnp.asarray(v, jnp.float32)  # in bf16 a scale would shift every value it dequantizes
    if isinstance(v, np.ndarray):
      return jnp.asarray(v.astype(np.float32), dtype)
    return jax.tree.map(jnp.asarray, v)  # a quantized weight keeps its own dtypes

  params = unflatten_dict({tuple(k.split("/")): to_device(k, v) for k, v in found.items()})
  return params, kv_missing


def _declares_fp8_kv(scheme) -> bool:
  return scheme is not None and scheme.kv_cache == "FP8"


def _read_kv_scales(arrays, files, config: ModelConfig, scheme):
  """An FP8-KV checkpoint's ({params path: scale}, {names read}, [names missing])."""
  found, read, missing = {}, set(), []
  if not _declares_fp8_kv(scheme):
    return found, read, missing
  for i in range(config.num_layers):
    for param, name in zip(KV_SCALES, layouts.kv_scale_names(scheme.layout, i), strict=True):
      if name not in arrays:
        missing.append(name)
        continue
      try:
        found[f"layer_{i}/attn/{param}"] = layouts.read_kv_scale(name, arrays[name])
      except QuantFormatError as e:
        raise CheckpointError(f"{files[name]}: {e}") from e
      read.add(name)
  return found, read, missing


def _kv_misfit(config: ModelConfig, scheme) -> str:
  if not _declares_fp8_kv(scheme):
    kv = scheme.kv_cache if scheme else None
    return f"is present, but the config declares no FP8 KV cache (kv cache: {kv!r})"
  k, v = layouts.kv_scale_names(scheme.layout, 0)
  return (
    f"is not one the {scheme.layout} layout names for layers 0..{config.num_layers - 1} "
    f"({k!r}, {v!r}, ...)"
  )


def _warn_missing_kv_scales(path: str, missing: list[str]) -> None:
  shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
  warnings.warn(
    f"{path}: the config declares an FP8 KV cache but {len(missing)} k/v scale tensors are "
    f"missing ({shown}); they default to 1.0, which is wrong wherever K/V were calibrated to "
    "another scale. Pass calibrated scales with Model.with_fp8_kv if you have them.",
    stacklevel=3,
  )


def _read_quantized_linears(arrays, files, want, reader):
  """Every Linear kernel through the quantization reader (dense where the scheme says so)."""
  found, consumed = {}, set()

  def get(name):
    consumed.add(name)
    return arrays[name]

  for path, shape in want.items():
    if not path.endswith("/kernel"):
      continue
    module = names.module_of(path)
    try:
      w = reader(module, get, lambda name: name in arrays, shape)
    except QuantFormatError as e:
      raise CheckpointError(f"{_file_of(files, module)}: {e}") from e
    except KeyError as e:
      raise CheckpointError(f"{_file_of(files, module)}: missing tensor {e}") from e
    if tuple(w.shape) != tuple(shape):
      raise CheckpointError(
        f"{_file_of(files, module)}: {module} has shape {tuple(w.shape)}, "
        f"expected {tuple(shape)} (in, out)"
      )
    found[path] = w
  return found, consumed


def _file_of(files: dict[str, str], module: str) -> str:
  """The file holding a module's tensors, for an error message (a scan: only on the error path)."""
  return next((files[n] for n in files if n.startswith(module + ".")), "checkpoint")


def _tied_head(target: str, config: ModelConfig) -> bool:
  return target == "lm_head/kernel" and config.tie_word_embeddings


def load(path: str, dtype=jnp.bfloat16, fuse_projections: bool = True, mesh=None):
  """Loads config.json + safetensors (+ tokenizer.json, generation_config.json) from `path`.

  fuse_projections: q/k/v and gate/up become one matmul each (specdec.models.fuse), joined layer
  by layer as the separate kernels are released; the decode step is faster that way. False keeps
  the checkpoint's modules (to save or quantize the model again, or to inspect its params).
  mesh: a `specdec.sharding.make_mesh` mesh to place the params on, tensor-parallel by module
  (fusion is skipped when the mesh has a tensor axis > 1: a fused kernel does not split by heads).
  """
  from specdec.model import Model

  xla_env.enable_compile_cache()  # before the first compile of the process (fusing compiles)
  if not os.path.isdir(path):
    raise CheckpointError(f"{path}: not a directory")
  try:
    config = load_config(path)
  except ConfigError as e:
    raise CheckpointError(str(e)) from e
  with open(os.path.join(path, "config.json")) as f:
    raw = json.load(f)
  scheme = quant_scheme(path, raw)
  hybrid = isinstance(config, HybridConfig)
  if hybrid and (scheme is not None or linear_reader(raw, scheme) is not None):
    raise CheckpointError(f"{path}: quantized {config.model_type} checkpoints are not supported")
  params, kv_missing = read_params(
    path, config, dtype, linear_reader(raw, scheme), scheme, tensor_prefix(raw)
  )
  tokenizer = load_tokenizer(path, config.vocab_size)
  config = config.replace(eos_token_ids=_eos_ids(path, config))
  if kv_missing:
    _warn_missing_kv_scales(path, kv_missing)  # only once the load has succeeded
  model = Model(
    config=config,
    params={"params": nvfp4.for_device(params)},
    tokenizer=tokenizer,
    dtype=dtype,
    kv_dtype=FP8 if _declares_fp8_kv(scheme) else None,
  )
  if mesh is not None:
    from specdec import sharding

    model = sharding.on_mesh(model, mesh)
    if mesh.shape["tensor"] > 1:
      return model  # unfused: a fused kernel does not split by heads
  if fuse_projections and not hybrid:  # the hybrid stack keeps its projections separate
    return fuse.fuse_projections(model, release=True)
  return model


def save(path: str, model, dtype=None, layout: str = "modelopt") -> None:
  """Writes `model` in the HF layout this loader reads (config, safetensors, tokenizer); a hybrid
  model (Qwen3-Next, Qwen3-MoE) with its routed experts one tensor each, as HF stores them.

  Quantized kernels (NVFP4 / FP8 weights) are written in `layout` ("modelopt" or
  "compressed-tensors") with the matching quantization config; dense ones as plain weights. A
  model with an FP8 KV cache also declares it and writes its k/v scales (ModelOpt and
  compressed-tensors quantized weights only: those configs are where the declaration lives).
  """
  from specdec.ops.qmatmul import QuantizedWeight
  from specdec.quant import exl3
  from specdec.quant.nvfp4 import NVFP4Weight

  flat = {"/".join(k): v for k, v in flatten_dict(model.params["params"]).items()}
  fused = sorted({k.rsplit("/", 1)[0] for k in flat if k.split("/")[-2] in fuse.FUSED_NAMES})
  if fused:
    raise ValueError(
      f"save({path!r}): {fused[0]} (and {len(fused) - 1} more) are fused projections "
      "(specdec.models.fuse), which no checkpoint layout names; save the model before fusing "
      "(specdec.load(..., fuse_projections=False) keeps them separate)"
    )
  hybrid = isinstance(model.config, HybridConfig)
  quantized = (exl3.EXL3Weight, QuantizedWeight)
  if hybrid and any(isinstance(v, quantized) for v in flat.values()):
    raise ValueError(
      f"save({path!r}): quantized {model.config.model_type} checkpoints are not supported "
      "(specdec.load refuses them too)"
    )
  config = to_hf_dict(model.config)  # a model type no checkpoint is written for fails here
  os.makedirs(path, exist_ok=True)
  formats, exl3_bits = {}, []
  for key, value in flat.items():
    if isinstance(value, exl3.EXL3Weight):
      exl3_bits.append(value.bits)
    elif isinstance(value, QuantizedWeight):
      kind = "nvfp4" if isinstance(value, NVFP4Weight) else "fp8"
      formats[names.module_of(key)] = layouts.LinearFormat(kind, layout)
    elif key.endswith("/kernel") and not hybrid:  # a hybrid's: never quantized (above)
      formats[names.module_of(key)] = None
  kv_cache = "FP8" if model.kv_dtype is not None and jnp.dtype(model.kv_dtype) == FP8 else None
  if kv_cache and (exl3_bits or not any(formats.values())):
    raise ValueError(
      f"save({path!r}): an FP8 KV cache is declared in a ModelOpt / compressed-tensors "
      "quantization config, so it is written only with NVFP4 or FP8 weights (quantize_model)"
    )
  quant_config = hf_quant = None
  if exl3_bits:
    quant_config = exl3.quantization_config(exl3.EXL3Config(bits=float(np.mean(exl3_bits))))
  elif any(formats.values()):
    quant_config, hf_quant = layouts.write_quant_config(layout, formats, kv_cache=kv_cache)
    scheme = layouts.parse_quant_config({"quantization_config": quant_config}, hf_quant)
  tensors = layouts.write_kv_scales(layout, *model.kv_scales()) if kv_cache else {}
  for key, value in flat.items():
    if key.rsplit("/", 1)[-1] in KV_SCALES:
      continue  # written above in the layout's names, or unused without an FP8 cache
    if isinstance(value, exl3.EXL3Weight):
      tensors.update(exl3.write_linear(names.module_of(key), value))
      continue
    if isinstance(value, QuantizedWeight):
      tensors.update(layouts.write_linear(scheme, names.module_of(key), value))
      continue
    a = np.asarray(jnp.asarray(value, dtype or value.dtype))
    experts = hybrid_names.unstack_experts(key, a) if hybrid else None
    if experts is not None:
      tensors.update(experts)
      continue
    name, transpose = (hybrid_names.to_hf_name if hybrid else names.to_hf_name)(key)
    tensors[name] = np.ascontiguousarray(a.T if transpose else a)
  write_tensors(os.path.join(path, "model.safetensors"), tensors, {"format": "pt"})
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
