"""specdec: speculative decoding research in JAX.

Public API (internals may change):
  load(path, dtype)            an HF-layout checkpoint -> Model
  generate(model, prompts, ...) greedy / sampled / speculative generation with stats
  drafters                     null(), ngram(min_n, max_n), draft_lm(model)
  Model, ModelConfig, Sampling
  MemoryPlanError              generate's batch and context do not fit the device's memory

Importing specdec adds its default XLA flags to XLA_FLAGS unless they are set there
(`specdec.xla_env`): import it before running anything on JAX.
"""
# ruff: noqa: E402 -- the flags go into XLA_FLAGS before any other import could start JAX

from specdec import xla_env

xla_env.apply_defaults()

from specdec import drafters
from specdec.checkpoint.loader import load, save
from specdec.checkpoint.safetensors_io import CheckpointError
from specdec.decoding.generate import Generation, generate
from specdec.decoding.sampling import Sampling
from specdec.memory import MemoryPlanError
from specdec.model import Model
from specdec.models.config import ModelConfig

__all__ = [
  "CheckpointError",
  "Generation",
  "MemoryPlanError",
  "Model",
  "ModelConfig",
  "Sampling",
  "drafters",
  "generate",
  "load",
  "save",
]
