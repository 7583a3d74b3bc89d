"""Learned drafters in and out of their published layouts, the kind told apart by the files.

load_drafter(path, target)   speculators (`speculators_model_type`: dflash, dflash2, eagle3,
                             mtp), z-lab DFlash / DFlash2 (`architectures`), legacy EAGLE-3
                             (LlamaForCausalLMEagle3: EAGLE, SpecForge, SGLang), MTP tensors
                             (Qwen3-Next `mtp.*`, DeepSeek `model.layers.{L}.eh_proj`)
save_drafter(path, drafter, format)   "speculators" (vLLM's format, the default) or "native"
                             (z-lab DFlash, legacy EAGLE-3, the MTP head's own layout)
"""

import os

from specdec.checkpoint import loader
from specdec.checkpoint.safetensors_io import CheckpointError
from specdec.drafters import eagle3, mtp, speculators
from specdec.drafters.base import Drafter
from specdec.drafters.block import Block
from specdec.drafters.block_config import ARCH_DFLASH, ARCH_DFLASH2
from specdec.drafters.block_io import load_block, save_block
from specdec.models import config as model_config

FORMATS = ("speculators", "native")


def detect(path: str) -> str:
  """ "block", "eagle3" or "mtp" for a drafter checkpoint directory; raises naming what it read."""
  try:
    d, file = model_config.read_config_json(path)
    kind = speculators.model_type(d, file)
    lm = model_config.language_model_dict(d, file)  # a VL wrapper counts its MTP layers there
  except (ValueError, model_config.ConfigError) as e:
    raise CheckpointError(str(e)) from e
  if kind is not None:
    return "block" if kind in speculators.BLOCK_KINDS else kind
  arch = (d.get("architectures") or [None])[0]
  if arch in (ARCH_DFLASH, ARCH_DFLASH2) or "dflash_config" in d:
    return "block"
  if arch == eagle3.ARCH or "draft_vocab_size" in d:
    return "eagle3"
  if lm.get("num_nextn_predict_layers") or lm.get("mtp_num_hidden_layers"):
    return "mtp"
  raise CheckpointError(
    f"{file}: not a drafter layout specdec knows (no speculators_model_type, architectures "
    f"{arch!r} is not {ARCH_DFLASH}, {ARCH_DFLASH2} or {eagle3.ARCH}, no MTP layer count)"
  )


def load_drafter(path: str, target):
  """The learned drafter in `path` for `target`, whichever published layout it is in."""
  if not os.path.isdir(path):
    raise CheckpointError(f"{path}: not a directory")
  kind = detect(path)
  if kind == "block":
    return load_block(path, target)
  if kind == "eagle3":
    return eagle3.load_eagle3(path, target)
  return mtp.load_mtp(path, target)


def save_drafter(path: str, drafter, format: str = "speculators", dtype=None) -> None:
  """Writes a learned drafter (block, EAGLE-3, MTP) so vLLM (format "speculators") or its native
  engine loads it unchanged; `load_drafter` reads either back."""
  if format not in FORMATS:
    raise ValueError(f"save_drafter: format {format!r} is not one of {', '.join(FORMATS)}")
  speculators_format = format == "speculators"
  if isinstance(drafter, Block):
    fmt = "speculators" if speculators_format else "z-lab"
    ids = drafter.draft_ids
    save_block(path, drafter.cfg, drafter.draft_params, dtype, format=fmt, draft_ids=ids)
  elif isinstance(drafter, eagle3.Eagle3):
    eagle3.save_eagle3(
      path, drafter, dtype, format="speculators" if speculators_format else "legacy"
    )
  elif isinstance(drafter, mtp.MTP):
    if speculators_format and drafter.spec.layout != "speculators":
      raise ValueError(
        f"save_drafter: this MTP head is in the {drafter.spec.layout} layout (it chains "
        'differently from speculators\' MTP); save it with format="native"'
      )
    mtp.save_mtp(path, drafter, dtype)
  else:
    raise ValueError(
      f"save_drafter: {type(drafter).__name__} has no checkpoint layout (block, EAGLE-3, MTP do)"
    )


def save(path: str, model, dtype=None, layout: str = "modelopt", format: str = "speculators"):
  """`specdec.save`: a learned drafter in `format` (see save_drafter); a target Model in the HF
  layout `specdec.load` reads (`layout` names its quantized-weight format)."""
  if isinstance(model, Drafter):
    return save_drafter(path, model, format, dtype)
  return loader.save(path, model, dtype, layout)
