"""Deterministic, resumable [B, T] batches from a 1-D token stream (the uint16 .npy files).

An epoch is a seeded permutation of non-overlapping windows whose boundaries shift by a seeded
offset every epoch: the stdlib corpus is small, the zoo trains on it for many epochs, and shifted
boundaries keep repeated epochs from showing the model the very same windows. The position
(epoch, batch) is the whole state, so a restored iterator yields exactly what the original would
have yielded next.
"""

import numpy as np


class DataStateError(ValueError):
  """A saved data position that does not belong to this iterator's stream and geometry."""


def load_tokens(path: str, limit: int = 0) -> np.ndarray:
  """A token .npy, memory-mapped (read as batches need it); limit > 0 keeps only a prefix."""
  tokens = np.load(path, mmap_mode="r")
  if tokens.ndim != 1:
    raise ValueError(f"{path}: expected a 1-D token array, got shape {tokens.shape}")
  return tokens[:limit] if limit > 0 else tokens


class TokenWindows:
  """Endless iterator of int32 [batch_size, seq_len] windows; get_state/set_state for resume."""

  def __init__(self, tokens, batch_size: int, seq_len: int, seed: int = 0):
    if np.ndim(tokens) != 1:
      raise ValueError(f"tokens must be 1-D, got shape {np.shape(tokens)}")
    self.tokens = tokens
    self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
    # One window fewer than fits, so that any offset in [0, seq_len) stays inside the stream.
    self.windows = (len(tokens) - seq_len) // seq_len
    self.batches_per_epoch = self.windows // batch_size
    if self.batches_per_epoch < 1:
      raise ValueError(
        f"{len(tokens)} tokens make {self.windows} windows of {seq_len}: "
        f"not one batch of {batch_size}"
      )
    self.epoch, self.batch = 0, 0
    self._starts_epoch, self._starts = -1, None

  def __iter__(self):
    return self

  def _epoch_starts(self) -> np.ndarray:
    if self._starts_epoch != self.epoch:
      rng = np.random.default_rng([self.seed, self.epoch])
      offset = int(rng.integers(self.seq_len))
      self._starts = offset + rng.permutation(self.windows) * self.seq_len
      self._starts_epoch = self.epoch
    return self._starts

  def __next__(self) -> np.ndarray:
    if self.batch == self.batches_per_epoch:
      self.epoch, self.batch = self.epoch + 1, 0
    B, T = self.batch_size, self.seq_len
    starts_B = self._epoch_starts()[self.batch * B : (self.batch + 1) * B]
    self.batch += 1
    return np.asarray(self.tokens[starts_B[:, None] + np.arange(T)], np.int32)

  def _geometry(self) -> dict:
    return {
      "seed": self.seed,
      "batch_size": self.batch_size,
      "seq_len": self.seq_len,
      "num_tokens": len(self.tokens),
    }

  def get_state(self) -> dict:
    return {"epoch": self.epoch, "batch": self.batch, **self._geometry()}

  def set_state(self, state: dict) -> None:
    saved = {k: state.get(k) for k in self._geometry()}
    if saved != self._geometry():
      raise DataStateError(f"data position saved for {saved}; this stream is {self._geometry()}")
    self.epoch, self.batch = int(state["epoch"]), int(state["batch"])

  @property
  def tokens_seen(self) -> int:
    return (self.epoch * self.batches_per_epoch + self.batch) * self.batch_size * self.seq_len


class HeldOut:
  """The held-out stream as consecutive windows in fixed-shape batches, for one evaluation pass.

  Yields (tokens int32 [B, T], weights float32 [B]); the ragged tail (< T tokens) is dropped and
  the last batch is padded with weight-0 rows, so that evaluation compiles one shape.
  """

  def __init__(self, tokens, batch_size: int, seq_len: int, max_batches: int = 0):
    n_windows = len(tokens) // seq_len
    if max_batches > 0:
      n_windows = min(n_windows, max_batches * batch_size)
    if n_windows < 1:
      raise ValueError(f"{len(tokens)} held-out tokens make no window of {seq_len}")
    self.windows_WT = np.asarray(tokens[: n_windows * seq_len], np.int32).reshape(-1, seq_len)
    self.batch_size = batch_size

  def __len__(self) -> int:
    return -(-len(self.windows_WT) // self.batch_size)

  @property
  def num_tokens(self) -> int:
    return self.windows_WT.size

  def __iter__(self):
    B, T = self.batch_size, self.windows_WT.shape[1]
    for i in range(len(self)):
      rows = self.windows_WT[i * B : (i + 1) * B]
      weights_B = np.zeros(B, np.float32)
      weights_B[: len(rows)] = 1.0
      tokens_BT = np.zeros((B, T), np.int32)
      tokens_BT[: len(rows)] = rows
      yield tokens_BT, weights_B
