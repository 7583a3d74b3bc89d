"""A strict safetensors reader/writer over numpy (bf16 and fp8 via ml_dtypes).

Our own reader because the numpy backend of the `safetensors` package has no bfloat16, and because
a truncated or corrupt file must produce an error naming the file and the tensor.
"""

import json
import os
import struct

import ml_dtypes
import numpy as np

DTYPES = {
  "F64": np.dtype(np.float64),
  "F32": np.dtype(np.float32),
  "F16": np.dtype(np.float16),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
  "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
  "I64": np.dtype(np.int64),
  "I32": np.dtype(np.int32),
  "I16": np.dtype(np.int16),
  "I8": np.dtype(np.int8),
  "U8": np.dtype(np.uint8),
  "BOOL": np.dtype(np.bool_),
}
NAMES = {v: k for k, v in DTYPES.items()}


class CheckpointError(ValueError):
  """A checkpoint that cannot be loaded; the message names the file and tensor."""


def read_header(file: str) -> tuple[dict, int]:
  """Returns ({name: (dtype, shape, (begin, end))}, data_offset), validating every entry."""
  try:
    size = os.path.getsize(file)
    with open(file, "rb") as f:
      raw = f.read(8)
      if len(raw) < 8:
        raise CheckpointError(f"{file}: truncated safetensors file (no header length)")
      (n,) = struct.unpack("<Q", raw)
      if n > size - 8:
        raise CheckpointError(f"{file}: corrupt safetensors header (length {n} > file size {size})")
      header = json.loads(f.read(n))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{file}: corrupt safetensors header ({e})") from e
  except OSError as e:
    raise CheckpointError(f"{file}: cannot read ({e})") from e
  header.pop("__metadata__", None)
  entries, data_size = {}, size - 8 - n
  for name, h in header.items():
    if h.get("dtype") not in DTYPES:
      raise CheckpointError(f"{file}: tensor {name!r} has unsupported dtype {h.get('dtype')!r}")
    dtype, shape = DTYPES[h["dtype"]], tuple(h["shape"])
    begin, end = h["data_offsets"]
    if end - begin != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
      raise CheckpointError(f"{file}: tensor {name!r} byte range does not match shape {shape}")
    if end > data_size:
      raise CheckpointError(
        f"{file}: truncated: tensor {name!r} needs bytes up to {end}, file has {data_size}"
      )
    entries[name] = (dtype, shape, (begin, end))
  return entries, 8 + n


def read_tensors(file: str, names=None) -> dict[str, np.ndarray]:
  entries, offset = read_header(file)
  out = {}
  with open(file, "rb") as f:
    for name in entries if names is None else names:
      dtype, shape, (begin, end) = entries[name]
      f.seek(offset + begin)
      buf = f.read(end - begin)
      if len(buf) != end - begin:
        raise CheckpointError(f"{file}: truncated while reading tensor {name!r}")
      out[name] = np.frombuffer(buf, dtype=dtype).reshape(shape)
  return out


def write_tensors(file: str, tensors: dict[str, np.ndarray], metadata=None) -> None:
  """Writes atomically (temporary file + rename) so a killed writer leaves no half file."""
  header, chunks, pos = {}, [], 0
  for name in sorted(tensors):
    a = np.asarray(tensors[name])
    # ascontiguousarray would make a 0-d scalar [1]; ModelOpt's per-tensor scales are 0-d.
    a = np.ascontiguousarray(a) if a.ndim else a
    if a.dtype not in NAMES:
      raise CheckpointError(f"{file}: tensor {name!r} has unsupported dtype {a.dtype}")
    b = a.tobytes()
    header[name] = {
      "dtype": NAMES[a.dtype],
      "shape": list(a.shape),
      "data_offsets": [pos, pos + len(b)],
    }
    chunks.append(b)
    pos += len(b)
  if metadata:
    header["__metadata__"] = metadata
  h = json.dumps(header, separators=(",", ":")).encode()
  h += b" " * (-len(h) % 8)
  tmp = file + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for b in chunks:
      f.write(b)
  os.replace(tmp, file)


def checkpoint_files(path: str) -> dict[str, str]:
  """Maps tensor name -> file for a single-file or sharded (index.json) checkpoint."""
  index = os.path.join(path, "model.safetensors.index.json")
  single = os.path.join(path, "model.safetensors")
  if os.path.exists(index):
    try:
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError) as e:
      raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from e
    files = {}
    for shard in sorted(set(weight_map.values())):
      shard_file = os.path.join(path, shard)
      if not os.path.exists(shard_file):
        raise CheckpointError(f"{index}: shard {shard!r} is listed but missing")
      entries, _ = read_header(shard_file)
      for name in entries:
        files[name] = shard_file
    for name, shard in weight_map.items():
      if files.get(name) != os.path.join(path, shard):
        raise CheckpointError(f"{index}: tensor {name!r} is not in its listed shard {shard!r}")
    return files
  if os.path.exists(single):
    return {name: single for name in read_header(single)[0]}
  raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")
