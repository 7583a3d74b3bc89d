"""A reduced draft vocabulary as published (EAGLE-3, speculators DFlash): `d2t` int [Vd] holds,
for each draft id d, the offset to its target id (target = d + d2t[d]); `t2d` bool [V] marks the
target ids the draft can emit. Here the map is `draft_ids` int32 [Vd], the target id of each."""

import numpy as np

from specdec.checkpoint.safetensors_io import CheckpointError


def draft_ids_from_tensors(found: dict, draft_vocab: int, vocab: int, path: str) -> np.ndarray:
  """{"d2t": .., optional "t2d": ..} -> draft_ids; every inconsistency names the tensor."""
  Vd, V = draft_vocab, vocab
  if "d2t" not in found:
    if Vd != V:
      raise CheckpointError(f"{path}: missing tensor 'd2t' (draft_vocab_size {Vd} < vocab {V})")
    return np.arange(V, dtype=np.int32)
  d2t = found["d2t"]
  if d2t.shape != (Vd,) or d2t.dtype.kind not in "iu":
    raise CheckpointError(
      f"{path}: tensor 'd2t' is {d2t.dtype.name} {d2t.shape}; expected integer ({Vd},)"
    )
  ids = np.arange(Vd) + d2t.astype(np.int64)
  if ids.min() < 0 or ids.max() >= V or len(np.unique(ids)) != Vd:
    raise CheckpointError(
      f"{path}: tensor 'd2t' maps draft ids outside [0, {V}) or two onto one target id"
    )
  if "t2d" in found:
    t2d = found["t2d"]
    mask = np.zeros(V, bool)
    mask[ids] = True
    if t2d.shape != (V,) or not np.array_equal(t2d.astype(bool), mask):
      raise CheckpointError(f"{path}: tensor 't2d' disagrees with 'd2t'")
  return ids.astype(np.int32)


def vocab_tensors(draft_ids, vocab: int) -> dict[str, np.ndarray]:
  """draft_ids -> the published {"d2t": int64 offsets, "t2d": bool mask}."""
  ids = np.asarray(draft_ids, np.int64)
  t2d = np.zeros(vocab, bool)
  t2d[ids] = True
  return {"d2t": ids - np.arange(len(ids)), "t2d": t2d}
