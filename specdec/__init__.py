"""specdec: speculative decoding research in JAX.

Public API (internals may change):
  load(path, dtype)            an HF-layout checkpoint -> Model (projections fused)
  load_drafter(path, target)   a learned drafter in any published layout (speculators, z-lab,
                               EAGLE-3, MTP); save(path, drafter) writes the speculators format
  generate(model, prompts, ...) greedy / sampled / speculative generation with stats
  drafters                     null(), ngram(min_n, max_n), draft_lm(model), load_* for learned ones
  Model, ModelConfig, Sampling
  MemoryPlanError              generate's batch and context do not fit the device's memory

Importing specdec has no side effects and imports nothing heavy: each name is imported on first
use. The XLA flag defaults (`specdec.xla_env`) are applied by the entry points, not here.
"""

import importlib

_EXPORTS = {
  "CheckpointError": "specdec.checkpoint.safetensors_io",
  "Generation": "specdec.decoding.generate",
  "MemoryPlanError": "specdec.decoding.memory",
  "Model": "specdec.model",
  "ModelConfig": "specdec.models.config",
  "Sampling": "specdec.ops.sampling",
  "generate": "specdec.decoding.generate",
  "load": "specdec.checkpoint.loader",
  "load_drafter": "specdec.drafters.checkpoints",
  "save": "specdec.drafters.checkpoints",
}

__all__ = sorted([*_EXPORTS, "drafters"])


def __getattr__(name: str):
  if name == "drafters":
    return importlib.import_module("specdec.drafters")
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f"module 'specdec' has no attribute {name!r}")


def __dir__():
  return __all__
