"""Quantized linear layers in HF checkpoints: the ModelOpt and compressed-tensors layouts.

`parse_quant_config` turns `config.json` (and ModelOpt's `hf_quant_config.json`) into a
`QuantScheme` that says which format each module uses; `read_linear` / `write_linear` convert one
linear layer between checkpoint tensors and our weight types; `write_quant_config` writes configs.

Tensors of one linear with HF prefix P (checkpoints store W as [out, in]):
  ModelOpt NVFP4            P.weight u8 [out, in/2], P.weight_scale e4m3 [out, in/16],
                            P.weight_scale_2 f32 [] (dequant multiplies), P.input_scale (W4A4)
  compressed-tensors NVFP4  P.weight_packed, P.weight_scale (same bytes as ModelOpt),
                            P.weight_global_scale f32 [1] (= 1 / weight_scale_2: dequant divides),
                            P.input_global_scale (W4A4)
  FP8 (both)                P.weight e4m3 [out, in], P.weight_scale: ModelOpt [] or [out],
                            compressed-tensors [1] or [out, 1]; P.input_scale for static activations
  unquantized               P.weight bf16/f16/f32 [out, in]

FP8 KV cache (kv_cache_quant_algo "FP8" / kv_cache_scheme {num_bits 8, type float}), per layer N:
  ModelOpt                  model.layers.N.self_attn.k_proj.k_scale, ...v_proj.v_scale  f32 []
  compressed-tensors        model.layers.N.self_attn.k_scale, ...self_attn.v_scale      f32 [1]
  both: the cache stores K / k_scale as e4m3 and dequant multiplies (vLLM's reading of both names)

Activation scales are not read: the framework runs these formats weight-only (W4A16 / W8A16).
Fused projections (qkv, gate_up) are separate tensors per shard in HF checkpoints, each with its
own global scale; read them one by one and fuse with `nvfp4.concat_columns` / `fp8.concat_columns`,
which keep one global scale per shard (a fused weight must never share one). To write a fused
weight, write each shard (`w.columns(start, stop)`) under its own module name.
"""

import dataclasses
import fnmatch
import re
from collections.abc import Callable, Mapping
from typing import Literal

import ml_dtypes
import numpy as np

from specdec.quant.errors import QuantFormatError
from specdec.quant.fp8 import FP8Weight
from specdec.quant.nvfp4 import GROUP, NVFP4Weight

Layout = Literal["modelopt", "compressed-tensors"]
MODELOPT: Layout = "modelopt"
CT: Layout = "compressed-tensors"
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
DENSE_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
GetTensor = Callable[[str], np.ndarray]


@dataclasses.dataclass(frozen=True)
class LinearFormat:
  kind: Literal["nvfp4", "fp8"]
  layout: Layout
  per_channel: bool = False  # fp8: one scale per output row rather than per tensor
  activations: str | None = None  # what the checkpoint meant activations to be ("nvfp4", "fp8")


# ModelOpt quant_algo -> format of every (non-excluded) linear.
_MODELOPT_ALGOS = {
  "NVFP4": LinearFormat("nvfp4", MODELOPT, activations="nvfp4"),
  "W4A16_NVFP4": LinearFormat("nvfp4", MODELOPT),
  "FP8": LinearFormat("fp8", MODELOPT, activations="fp8"),
  "FP8_PER_CHANNEL_PER_TOKEN": LinearFormat("fp8", MODELOPT, per_channel=True, activations="fp8"),
}
_KV_ALGOS = (None, "FP8", "NVFP4")


@dataclasses.dataclass(frozen=True)
class QuantScheme:
  """Which format applies to each linear module of one checkpoint (None: stored unquantized)."""

  layout: Layout | None = None
  default: LinearFormat | None = None  # ModelOpt: every linear not excluded
  layers: tuple[tuple[str, LinearFormat], ...] = ()  # ModelOpt MIXED_PRECISION: module prefixes
  targets: tuple[tuple[str, LinearFormat | None], ...] = ()  # compressed-tensors, precedence order
  ignore: tuple[str, ...] = ()  # ModelOpt exclude_modules (globs) / compressed-tensors ignore
  kv_cache: str | None = None  # "FP8" (k/v scales read, FP8 cache by default) / "NVFP4" / None

  def format_for(self, module_name: str) -> LinearFormat | None:
    if self.layout == MODELOPT:
      if any(_glob_match(module_name, p) for p in self.ignore):
        return None
      if not self.layers:
        return self.default
      prefixes = [
        (k, f) for k, f in self.layers if module_name == k or module_name.startswith(k + ".")
      ]
      return max(prefixes, key=lambda kf: len(kf[0]))[1] if prefixes else None
    if self.layout == CT:
      if any(_ct_name_match(module_name, t) for t in self.ignore):
        return None
      for target, fmt in self.targets:
        if _ct_name_match(module_name, target):
          return fmt
      # Class-name targets: every module asked about here is a Linear. Other class names (attention
      # or MoE blocks) never target a linear's weights.
      return next((fmt for target, fmt in self.targets if target == "Linear"), None)
    return None


def _glob_match(name: str, pattern: str) -> bool:
  """ModelOpt exclude_modules are fnmatch globs ("lm_head", "model.layers.0.mlp*"); a plain module
  name also excludes its children."""
  return fnmatch.fnmatchcase(name, pattern) or name.startswith(pattern + ".")


def _ct_name_match(name: str, target: str) -> bool:
  """compressed-tensors: "re:<regex>" matches with re.match (anchored at the start only), anything
  else must equal the module name."""
  if target.startswith("re:"):
    return re.match(target[3:], name) is not None
  return target == name


# ------------------------------------------------------------------------------------------- config


def parse_quant_config(config: Mapping, hf_quant_config: Mapping | None = None) -> QuantScheme:
  """config.json (whole, or its quantization_config) and ModelOpt's hf_quant_config.json, if any."""
  qc = config.get("quantization_config", config if "quant_method" in config else None)
  if hf_quant_config is not None:
    # ModelOpt writes both; hf_quant_config.json is the fuller one (quantized_layers, group_size).
    if qc is not None and qc.get("quant_method", MODELOPT) != MODELOPT:
      raise QuantFormatError(
        f"quantization_config.quant_method: {qc.get('quant_method')!r}, but an "
        "hf_quant_config.json (ModelOpt) was given too"
      )
    nested = str((hf_quant_config.get("quantization") or {}).get("quant_algo")).upper()
    if qc is not None and qc.get("quant_algo") and str(qc["quant_algo"]).upper() != nested:
      raise QuantFormatError(
        f"quantization_config.quant_algo: {qc['quant_algo']!r} disagrees with "
        f"hf_quant_config.json quantization.quant_algo {nested!r}"
      )
    return _parse_modelopt_nested(hf_quant_config)
  if qc is None:
    return QuantScheme()
  method = qc.get("quant_method")
  if method == MODELOPT:
    return _parse_modelopt_flat(qc)
  if method == CT:
    return _parse_ct(qc)
  raise QuantFormatError(
    f"quantization_config.quant_method: unsupported {method!r} (supported: {MODELOPT!r}, {CT!r})"
  )


def _modelopt_format(key: str, algo, group_size) -> LinearFormat | None:
  if algo is None:
    return None
  fmt = _MODELOPT_ALGOS.get(str(algo).upper())
  if fmt is None:
    raise QuantFormatError(
      f"{key}.quant_algo: unsupported {algo!r} "
      f"(supported: {sorted(_MODELOPT_ALGOS)} and MIXED_PRECISION)"
    )
  if fmt.kind == "nvfp4" and group_size not in (None, GROUP):
    raise QuantFormatError(f"{key}.group_size: NVFP4 needs groups of {GROUP}, got {group_size!r}")
  return fmt


def _modelopt_scheme(key, algo, group_size, exclude, layers, kv) -> QuantScheme:
  if kv not in _KV_ALGOS:
    raise QuantFormatError(f"{key}: unsupported kv cache algo {kv!r} (supported: {_KV_ALGOS})")
  if algo is not None and str(algo).upper() == "MIXED_PRECISION":
    if not isinstance(layers, Mapping):
      raise QuantFormatError(f"{key}.quantized_layers: MIXED_PRECISION needs a module -> algo map")
    parsed = tuple(
      (
        name,
        _modelopt_format(
          f"{key}.quantized_layers[{name!r}]", d.get("quant_algo"), d.get("group_size")
        ),
      )
      for name, d in layers.items()
    )
    return QuantScheme(
      MODELOPT, None, tuple((n, f) for n, f in parsed if f), (), tuple(exclude), kv
    )
  return QuantScheme(MODELOPT, _modelopt_format(key, algo, group_size), (), (), tuple(exclude), kv)


def _parse_modelopt_nested(hf: Mapping) -> QuantScheme:
  q = hf.get("quantization")
  if not isinstance(q, Mapping):
    raise QuantFormatError("hf_quant_config.json: missing the 'quantization' section")
  return _modelopt_scheme(
    "hf_quant_config.json quantization",
    q.get("quant_algo"),
    q.get("group_size"),
    q.get("exclude_modules") or [],
    q.get("quantized_layers"),
    q.get("kv_cache_quant_algo"),
  )


def _parse_modelopt_flat(qc: Mapping) -> QuantScheme:
  group_size = qc.get("group_size")
  for group in (qc.get("config_groups") or {}).values():
    group_size = group_size or (group.get("weights") or {}).get("group_size")
  kv = qc.get("kv_cache_scheme")
  if isinstance(kv, Mapping):
    kv = "FP8" if (kv.get("num_bits"), kv.get("type")) == (8, "float") else f"{kv}"
  return _modelopt_scheme(
    "quantization_config",
    qc.get("quant_algo"),
    group_size,
    qc.get("ignore") or qc.get("exclude_modules") or [],
    qc.get("quantized_layers"),
    kv,
  )


def _ct_format(key: str, group: Mapping, default_format: str | None) -> LinearFormat | None:
  w = group.get("weights")
  fmt = group.get("format") or (default_format if default_format != "mixed-precision" else None)
  if w is None or fmt == "dense":
    return None
  bits, kind, strategy = w.get("num_bits"), w.get("type"), w.get("strategy")
  acts = group.get("input_activations")
  activations = None
  if acts:
    activations = {(4, "float"): "nvfp4", (8, "float"): "fp8"}.get(
      (acts.get("num_bits"), acts.get("type")), f"{acts.get('type')}{acts.get('num_bits')}"
    )
  if not w.get("symmetric", True) or w.get("dynamic", False):
    raise QuantFormatError(f"{key}.weights: only symmetric static weight scales are supported")
  if (bits, kind) == (4, "float"):
    if w.get("group_size") != GROUP:
      raise QuantFormatError(
        f"{key}.weights.group_size: NVFP4 needs groups of {GROUP}, got {w.get('group_size')!r}"
      )
    if strategy not in (None, "tensor_group") or fmt not in (None, "nvfp4-pack-quantized"):
      raise QuantFormatError(
        f"{key}: 4-bit float weights with strategy {strategy!r}, format {fmt!r} are not NVFP4 "
        "(tensor_group, nvfp4-pack-quantized)"
      )
    if str(w.get("scale_dtype") or "float8_e4m3fn").removeprefix("torch.") != "float8_e4m3fn":
      raise QuantFormatError(f"{key}.weights.scale_dtype: NVFP4 needs float8_e4m3fn scales")
    return LinearFormat("nvfp4", CT, activations=activations)
  if (bits, kind) == (8, "float"):
    if strategy not in (None, "tensor", "channel") or fmt not in (
      None,
      "float-quantized",
      "naive-quantized",
    ):
      raise QuantFormatError(
        f"{key}: FP8 weights with strategy {strategy!r}, format {fmt!r} are not supported "
        "(tensor or channel scales, float-quantized)"
      )
    return LinearFormat("fp8", CT, per_channel=strategy == "channel", activations=activations)
  raise QuantFormatError(
    f"{key}.weights: unsupported scheme num_bits={bits!r} type={kind!r} strategy={strategy!r} "
    f"format={fmt!r} (supported: NVFP4, FP8)"
  )


def _parse_ct(qc: Mapping) -> QuantScheme:
  for extra in ("sparsity_config", "transform_config"):
    if qc.get(extra):
      raise QuantFormatError(
        f"quantization_config.{extra}: not supported (would change the weights)"
      )
  # A target repeated in a later group overrides the earlier one, as in compressed-tensors.
  by_target: dict[str, LinearFormat | None] = {}
  for name, group in (qc.get("config_groups") or {}).items():
    key = f"quantization_config.config_groups.{name}"
    if not isinstance(group, Mapping):
      raise QuantFormatError(f"{key}: preset-name groups are not supported, expand the scheme")
    fmt = _ct_format(key, group, qc.get("format"))
    for target in group.get("targets") or []:
      by_target[target] = fmt
  # compressed-tensors' precedence: exact names, then regexes, each alphabetically.
  order = sorted(by_target, key=lambda t: (t.startswith("re:"), t))
  kv = qc.get("kv_cache_scheme")
  if isinstance(kv, Mapping):
    kv = {(8, "float"): "FP8", (4, "float"): "NVFP4"}.get(
      (kv.get("num_bits"), kv.get("type")), f"{kv}"
    )
  return QuantScheme(
    CT, None, (), tuple((t, by_target[t]) for t in order), tuple(qc.get("ignore") or ()), kv
  )


def write_quant_config(
  layout: Layout, formats: Mapping[str, LinearFormat | None], *, kv_cache: str | None = None
) -> tuple[dict, dict | None]:
  """(config.json "quantization_config", hf_quant_config.json or None) for module -> format.

  Weight-only configs: NVFP4 as W4A16 (ModelOpt W4A16_NVFP4, compressed-tensors NVFP4A16), FP8
  without input_activations for compressed-tensors and as FP8 / FP8_PER_CHANNEL_PER_TOKEN for
  ModelOpt (whose FP8 also expects an input_scale, which `write_linear` does not invent).
  """
  if kv_cache not in _KV_ALGOS:
    raise QuantFormatError(f"kv_cache: unsupported {kv_cache!r} (supported: {_KV_ALGOS})")
  quantized = {name: f for name, f in formats.items() if f is not None}
  plain = sorted(name for name, f in formats.items() if f is None)
  if not quantized:
    raise QuantFormatError("write_quant_config: no quantized module")
  if layout == MODELOPT:
    return _modelopt_configs(quantized, plain, kv_cache)
  if layout == CT:
    return _ct_config(quantized, plain, kv_cache), None
  raise QuantFormatError(f"unknown layout {layout!r}")


def _modelopt_algo(fmt: LinearFormat) -> str:
  if fmt.kind == "nvfp4":
    return "W4A16_NVFP4"
  return "FP8_PER_CHANNEL_PER_TOKEN" if fmt.per_channel else "FP8"


def _modelopt_configs(quantized, plain, kv_cache) -> tuple[dict, dict]:
  algos = {name: _modelopt_algo(f) for name, f in quantized.items()}
  layer_cfg = lambda a: {"quant_algo": a, **({"group_size": GROUP} if "NVFP4" in a else {})}
  q: dict = {"kv_cache_quant_algo": kv_cache, "exclude_modules": plain}
  if len(set(algos.values())) == 1:
    q.update(layer_cfg(next(iter(algos.values()))))
  else:
    q["quant_algo"] = "MIXED_PRECISION"
    q["quantized_layers"] = {name: layer_cfg(a) for name, a in sorted(algos.items())}
  producer = {"name": "specdec", "version": "0.1.0"}
  hf = {"producer": producer, "quantization": q}

  # config.json's copy, shaped like ModelOpt's export: CT-looking groups, ModelOpt tensor names.
  groups = {}
  for i, algo in enumerate(sorted(set(algos.values()))):
    fmt = _MODELOPT_ALGOS[algo]
    weights = {"dynamic": False, "num_bits": 4 if fmt.kind == "nvfp4" else 8, "type": "float"}
    weights.update({"group_size": GROUP} if fmt.kind == "nvfp4" else {})
    weights.update({"strategy": "channel"} if fmt.per_channel else {})
    if "quantized_layers" in q:
      targets = sorted(n for n, a in algos.items() if a == algo)
    else:
      targets = ["Linear"]
    groups[f"group_{i}"] = {"weights": weights, "targets": targets}
  qc = {"config_groups": groups, "ignore": plain, "quant_algo": q["quant_algo"]}
  if "quantized_layers" in q:
    qc["quantized_layers"] = q["quantized_layers"]
  if kv_cache is not None:
    qc["kv_cache_scheme"] = (
      {"dynamic": False, "num_bits": 8, "type": "float"} if kv_cache == "FP8" else kv_cache
    )
  qc.update(producer=producer, quant_method=MODELOPT)
  return qc, hf


def _ct_config(quantized, plain, kv_cache) -> dict:
  kinds = sorted({(f.kind, f.per_channel) for f in quantized.values()})
  groups = {}
  for i, (kind, per_channel) in enumerate(kinds):
    if kind == "nvfp4":
      fmt = "nvfp4-pack-quantized"
      weights = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": GROUP}
      weights |= {
        "strategy": "tensor_group",
        "dynamic": False,
        "scale_dtype": "torch.float8_e4m3fn",
      }
    else:
      fmt = "float-quantized"
      weights = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None}
      weights |= {"strategy": "channel" if per_channel else "tensor", "dynamic": False}
    targets = sorted(
      n for n, f in quantized.items() if (f.kind, f.per_channel) == (kind, per_channel)
    )
    groups[f"group_{i}"] = {
      "targets": targets,
      "weights": weights,
      "input_activations": None,
      "output_activations": None,
      "format": fmt,
    }
  formats = {g["format"] for g in groups.values()}
  kv = None
  if kv_cache == "FP8":
    kv = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False}
  elif kv_cache == "NVFP4":
    raise QuantFormatError("kv_cache: compressed-tensors NVFP4 kv cache is not written")
  return {
    "config_groups": groups,
    "quant_method": CT,
    "kv_cache_scheme": kv,
    "format": formats.pop() if len(formats) == 1 else "mixed-precision",
    "quantization_status": "compressed",
    "global_compression_ratio": None,
    "ignore": plain,
  }


# ------------------------------------------------------------------------------------------ tensors


class _Tensors:
  """The tensors of one module, fetched once each; a missing one is None."""

  def __init__(self, prefix: str, get_tensor: GetTensor):
    self.prefix, self._get, self._seen = prefix, get_tensor, {}

  def name(self, key: str) -> str:
    return f"{self.prefix}.{key}"

  def get(self, key: str) -> np.ndarray | None:
    if key not in self._seen:
      try:
        self._seen[key] = np.asarray(self._get(self.name(key)))
      except KeyError:
        self._seen[key] = None
    return self._seen[key]

  def need(self, key: str, fmt: str) -> np.ndarray:
    a = self.get(key)
    if a is None:
      raise QuantFormatError(
        f"{self.name(key)}: missing, but the config stores {self.prefix} as {fmt}"
      )
    return a


def read_linear(
  scheme: QuantScheme,
  module_name: str,
  get_tensor: GetTensor,
  *,
  shape: tuple[int, int] | None = None,
) -> np.ndarray | NVFP4Weight | FP8Weight:
  """One linear layer as a dense (in, out) array or a quantized weight (numpy-backed leaves).

  `get_tensor(name)` returns a numpy array or raises KeyError. `shape`, if given, is the (in, out)
  the model expects. A module the config quantizes but the checkpoint stores as a plain float
  `weight` without scales (ModelOpt exports keep `mtp.fc` in bf16 without excluding it) reads dense.
  """
  fmt = scheme.format_for(module_name)
  t = _Tensors(module_name, get_tensor)
  if fmt is None:
    for key in ("weight_packed", "weight_scale", "weight_global_scale", "weight_scale_2"):
      if t.get(key) is not None:
        raise QuantFormatError(
          f"{t.name(key)}: present, but the config leaves {module_name} unquantized"
        )
    return _read_dense(t, shape, "unquantized")
  stored_dense = (
    t.get("weight_scale") is None
    and t.get("weight_packed") is None
    and t.get("weight") is not None
    and t.get("weight").dtype in DENSE_DTYPES
  )
  if stored_dense:
    return _read_dense(t, shape, "a plain float weight")
  if fmt.kind == "nvfp4":
    return _read_nvfp4(t, fmt, shape)
  return _read_fp8(t, fmt, shape)


def _check(t: _Tensors, key: str, a: np.ndarray, dtypes, ndims, what: str):
  if a.dtype not in dtypes or a.ndim not in ndims:
    raise QuantFormatError(f"{t.name(key)}: expected {what}, got {a.dtype} with shape {a.shape}")


def _check_shape(t: _Tensors, key: str, got: tuple[int, int], shape):
  if shape is not None and tuple(shape) != got:
    raise QuantFormatError(
      f"{t.name(key)}: holds an (in, out) = {got} weight, the model expects {tuple(shape)}"
    )


def _check_scale_values(t: _Tensors, key: str, a: np.ndarray, positive: bool):
  a = a.astype(np.float32)
  finite = np.isfinite(a)
  if not np.all(finite) or np.any(a <= 0 if positive else a < 0):
    low = a[finite].min() if finite.any() else None
    raise QuantFormatError(
      f"{t.name(key)}: scales must be finite and {'> 0' if positive else '>= 0'}; "
      f"got min {low}, {np.count_nonzero(~finite)} non-finite"
    )


def _read_dense(t: _Tensors, shape, why: str) -> np.ndarray:
  w = t.need("weight", why)
  _check(t, "weight", w, DENSE_DTYPES, (2,), f"a {why} [out, in] float weight")
  _check_shape(t, "weight", (w.shape[1], w.shape[0]), shape)
  return w.T


def _read_nvfp4(t: _Tensors, fmt: LinearFormat, shape) -> NVFP4Weight:
  ct = fmt.layout == CT
  packed_key, global_key = (
    ("weight_packed", "weight_global_scale") if ct else ("weight", "weight_scale_2")
  )
  what = f"{fmt.layout} NVFP4"
  packed = t.need(packed_key, what)
  scales = t.need("weight_scale", what)
  g = t.need(global_key, what)
  if t.get("weight_zero_point") is not None:
    raise QuantFormatError(f"{t.name('weight_zero_point')}: asymmetric NVFP4 is not supported")
  _check(t, packed_key, packed, (np.dtype(np.uint8),), (2,), "uint8 packed E2M1 codes [out, in/2]")
  n, k = packed.shape[0], 2 * packed.shape[1]
  if k % GROUP:
    raise QuantFormatError(
      f"{t.name(packed_key)}: in_features {k} (shape {packed.shape}) is not a multiple of {GROUP}"
    )
  _check(t, "weight_scale", scales, (E4M3,), (2,), "float8_e4m3fn block scales [out, in/16]")
  if scales.shape != (n, k // GROUP):
    per = f"{k / scales.shape[1]:g}" if scales.shape[1] else "?"
    raise QuantFormatError(
      f"{t.name('weight_scale')}: shape {scales.shape} does not fit {t.name(packed_key)} "
      f"{packed.shape}: NVFP4 needs [out, in/16] = {(n, k // GROUP)} (groups of {GROUP}, "
      f"this is {per} per group)"
    )
  _check(t, global_key, g, DENSE_DTYPES, (0, 1), "a float32 scalar global scale")
  if g.size != 1:
    raise QuantFormatError(
      f"{t.name(global_key)}: expected one global scale, got shape {g.shape} "
      "(a fused checkpoint tensor? read each shard separately)"
    )
  _check_scale_values(t, global_key, g, positive=True)
  _check_scale_values(t, "weight_scale", scales, positive=False)
  _check_shape(t, packed_key, (k, n), shape)
  g_N = np.full((n,), g.astype(np.float32).reshape(()), np.float32)
  return NVFP4Weight(packed, scales, g_N, global_divides=ct)


def _read_fp8(t: _Tensors, fmt: LinearFormat, shape) -> FP8Weight:
  what = f"{fmt.layout} FP8"
  w = t.need("weight", what)
  s = t.need("weight_scale", what)
  _check(t, "weight", w, (E4M3,), (2,), "float8_e4m3fn codes [out, in]")
  n, k = w.shape
  _check(t, "weight_scale", s, DENSE_DTYPES, (0, 1, 2), "a float scale")
  per_tensor = s.size == 1 and s.shape in ((), (1,), (1, 1))
  per_channel = s.shape in ((n,), (n, 1))
  if not (per_tensor or per_channel):
    raise QuantFormatError(
      f"{t.name('weight_scale')}: shape {s.shape} fits neither a per-tensor ([] / [1]) nor a "
      f"per-channel ([{n}] / [{n}, 1]) scale for {t.name('weight')} {w.shape}; "
      "block-wise FP8 is not supported"
    )
  if per_channel and not per_tensor and not fmt.per_channel:
    raise QuantFormatError(
      f"{t.name('weight_scale')}: per-channel shape {s.shape}, but the config says per-tensor FP8"
    )
  if per_tensor and fmt.per_channel and n != 1:
    raise QuantFormatError(
      f"{t.name('weight_scale')}: per-tensor shape {s.shape}, but the config says per-channel FP8"
    )
  _check_scale_values(t, "weight_scale", s, positive=False)
  _check_shape(t, "weight", (k, n), shape)
  return FP8Weight(w, np.broadcast_to(s.astype(np.float32).reshape(-1), (n,)).copy())


def write_linear(
  scheme: QuantScheme, module_name: str, w, *, dense_dtype=ml_dtypes.bfloat16
) -> dict[str, np.ndarray]:
  """The checkpoint tensors of one linear layer, in the scheme's layout.

  A dense (in, out) array is written as a plain [out, in] `weight` in `dense_dtype` (also for a
  module the config quantizes: the reader accepts that). A weight whose global-scale orientation
  differs from the layout's (compressed-tensors written as ModelOpt) stores 1/g: one f32 rounding.
  """
  fmt = scheme.format_for(module_name)
  p = module_name
  if isinstance(w, NVFP4Weight | FP8Weight):
    kind = "nvfp4" if isinstance(w, NVFP4Weight) else "fp8"
    if fmt is None or fmt.kind != kind:
      raise QuantFormatError(
        f"{p}: cannot write an {kind} weight, the config says {fmt.kind if fmt else 'unquantized'}"
      )
    if len(w.shape) != 2 or np.ndim(w.scale_N if kind == "fp8" else w.global_scale_N) != 1:
      raise QuantFormatError(f"{p}: write one (in, out) layer at a time, not a stack")
  if isinstance(w, NVFP4Weight):
    g = _one_scale(p, np.asarray(w.global_scale_N, np.float32), "global scale")
    ct = fmt.layout == CT
    if w.global_divides != ct:
      g = np.float32(1) / g
    packed = np.asarray(w.in_order("checkpoint").packed_NP, np.uint8)
    scales = np.asarray(w.scales_NG).astype(E4M3)
    if ct:
      return {
        f"{p}.weight_packed": packed,
        f"{p}.weight_scale": scales,
        f"{p}.weight_global_scale": np.array([g], np.float32),
      }
    return {
      f"{p}.weight": packed,
      f"{p}.weight_scale": scales,
      f"{p}.weight_scale_2": np.array(g, np.float32),
    }
  if isinstance(w, FP8Weight):
    s_N = np.asarray(w.scale_N, np.float32)
    codes = np.asarray(w.codes_NK).astype(E4M3)
    if fmt.per_channel:
      scale = s_N[:, None] if fmt.layout == CT else s_N
    else:
      s = _one_scale(p, s_N, "scale (the config says per-tensor FP8)")
      scale = np.array([s], np.float32) if fmt.layout == CT else np.array(s, np.float32)
    return {f"{p}.weight": codes, f"{p}.weight_scale": scale}
  dense = np.asarray(w)
  if dense.ndim != 2:
    raise QuantFormatError(f"{p}: a dense weight must be (in, out), got shape {dense.shape}")
  return {f"{p}.weight": np.ascontiguousarray(dense.T).astype(dense_dtype)}


def _one_scale(p: str, s_N: np.ndarray, what: str) -> np.float32:
  if not np.all(s_N == s_N[0]):
    raise QuantFormatError(
      f"{p}: the {what} differs across output columns (a fused weight with per-shard scales?); "
      "write each shard with w.columns(start, stop) under its own module name"
    )
  return np.float32(s_N[0])


# ----------------------------------------------------------------------------------------- kv cache

KV_SCALE_SUFFIXES = (".k_scale", ".v_scale")


def kv_scale_names(layout: Layout, layer: int) -> tuple[str, str]:
  """(k, v) scale tensor names of one layer's FP8 KV cache: ModelOpt hangs them on the k/v
  projections, compressed-tensors on the attention module."""
  p = f"model.layers.{layer}.self_attn"
  if layout == MODELOPT:
    return f"{p}.k_proj.k_scale", f"{p}.v_proj.v_scale"
  return f"{p}.k_scale", f"{p}.v_scale"


def read_kv_scale(name: str, a: np.ndarray) -> np.float32:
  """One FP8 KV scale tensor: a finite float scalar > 0, stored [] or [1]."""
  if a.dtype not in DENSE_DTYPES or a.shape not in ((), (1,)):
    raise QuantFormatError(
      f"{name}: expected a float scalar KV cache scale ([] or [1]), got {a.dtype} with shape "
      f"{a.shape} (per-head KV scales are not supported)"
    )
  s = np.float32(a.reshape(()))
  if not (np.isfinite(s) and s > 0):
    raise QuantFormatError(f"{name}: a KV cache scale must be finite and > 0, got {s}")
  return s


def write_kv_scales(layout: Layout, k_L, v_L) -> dict[str, np.ndarray]:
  """Every layer's FP8 KV scale tensors in the layout's names and shapes."""
  shape = () if layout == MODELOPT else (1,)
  out = {}
  for i, pair in enumerate(zip(k_L, v_L, strict=True)):
    for name, s in zip(kv_scale_names(layout, i), pair, strict=True):
      out[name] = np.full(shape, s, np.float32)
  return out
