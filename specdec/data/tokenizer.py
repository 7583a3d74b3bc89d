"""Byte-level BPE for the tiny model zoo, trained on the stdlib corpus (`specdec.data.corpus`).

Byte-level means every string round-trips exactly (decode(encode(x)) == x), whitespace and
indentation included, which code needs. Training is deterministic: the same texts in the same order
give the same tokenizer.json, whatever the thread count or hash seed.
"""

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB_SIZE = 8192
EOS_TOKEN, PAD_TOKEN = "<|endoftext|>", "<|pad|>"
EOS_ID, PAD_ID = 0, 1
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN)  # in id order
ENCODE_BATCH = 64


def new_tokenizer() -> Tokenizer:
  tok = Tokenizer(models.BPE())
  # No prefix space: it would make decode(encode(x)) != x.
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
  """BPE over the bytes of `texts`; ids 0 and 1 are the special tokens, then the 256 bytes."""
  tok = new_tokenizer()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=list(SPECIAL_TOKENS),
    # All 256 bytes, also those the corpus lacks, so that no input is ever unencodable.
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(texts, trainer=trainer)
  check_special_ids(tok)
  return tok


def check_special_ids(tok: Tokenizer) -> None:
  for i, t in enumerate(SPECIAL_TOKENS):
    if tok.token_to_id(t) != i:
      raise ValueError(f"{t} has id {tok.token_to_id(t)}, expected {i}")


def save_tokenizer(tok: Tokenizer, path: str | Path) -> None:
  tok.save(str(path))


def load_tokenizer(path: str | Path) -> Tokenizer:
  """Loads a tokenizer.json (a file, or a folder holding one) written by `save_tokenizer`."""
  path = Path(path)
  if path.is_dir():
    path = path / "tokenizer.json"
  tok = Tokenizer.from_file(str(path))
  check_special_ids(tok)
  return tok


def encode_documents(tok: Tokenizer, texts: Iterable[str], dtype=np.uint16) -> np.ndarray:
  """All texts as one token stream, each document followed by EOS (the separator at training)."""
  if tok.get_vocab_size() > np.iinfo(dtype).max + 1:
    raise ValueError(f"vocab {tok.get_vocab_size()} does not fit {np.dtype(dtype).name}")
  parts = []
  batch = []
  eos = np.array([EOS_ID], dtype=dtype)

  def flush():
    for enc in tok.encode_batch(batch, add_special_tokens=False):
      parts.append(np.asarray(enc.ids, dtype=dtype))
      parts.append(eos)
    batch.clear()

  for text in texts:
    batch.append(text)
    if len(batch) == ENCODE_BATCH:
      flush()
  flush()
  return np.concatenate(parts) if parts else np.zeros(0, dtype)


def bytes_per_token(tok: Tokenizer, texts: Iterable[str]) -> tuple[float, int, int]:
  """(UTF-8 bytes per token, bytes, tokens) over `texts`, separators not counted."""
  texts = list(texts)
  n_bytes = sum(len(t.encode("utf-8")) for t in texts)
  n_tokens = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
  return n_bytes / max(n_tokens, 1), n_bytes, n_tokens
