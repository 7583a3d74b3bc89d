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


def read_params(path: str, config: ModelConfig, dtype) -> dict:
  files = checkpoint_files(path)
  want = expected_shapes(config)
  found: dict[str, np.ndarray] = {}
  by_file: dict[str, list[str]] = {}
  for name, file in files.items():
    by_file.setdefault(file, []).append(name)
  for file, tensor_names in sorted(by_file.items()):
    for name, array in read_tensors(file, tensor_names).items():
      if names.is_ignored(name):
        continue
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
  return unflatten_dict(
    {tuple(k.split("/")): jnp.asarray(v.astype(np.float32), dtype) for k, v in found.items()}
  )


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
  params = read_params(path, config, dtype)
  tokenizer = load_tokenizer(path, config.vocab_size)
  config = config.replace(eos_token_ids=_eos_ids(path, config))
  return Model(config=config, params={"params": params}, tokenizer=tokenizer, dtype=dtype)


def save(path: str, model, dtype=None) -> None:
  """Writes `model` in the HF layout this loader reads (config, safetensors, tokenizer)."""
  os.makedirs(path, exist_ok=True)
  tensors = {}
  for key, value in flatten_dict(model.params["params"]).items():
    name, transpose = names.to_hf_name("/".join(key))
    a = np.asarray(jnp.asarray(value, dtype or value.dtype))
    tensors[name] = np.ascontiguousarray(a.T if transpose else a)
  write_tensors(os.path.join(path, "model.safetensors"), tensors, {"format": "pt"})
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(to_hf_dict(model.config), f, indent=2)
  if model.config.eos_token_ids:
    with open(os.path.join(path, "generation_config.json"), "w") as f:
      json.dump({"eos_token_id": list(model.config.eos_token_ids)}, f, indent=2)
  if model.tokenizer is not None:
    model.tokenizer.save(os.path.join(path, "tokenizer.json"))
