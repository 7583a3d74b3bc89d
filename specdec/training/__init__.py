"""Training: a generic optax loop (drafters reuse it), token batching, LM pretraining and export."""

from specdec.training.data import HeldOut, TokenWindows, load_tokens
from specdec.training.loop import adamw, fit, warmup_cosine

__all__ = ["HeldOut", "TokenWindows", "adamw", "fit", "load_tokens", "warmup_cosine"]
