"""specdec.training.selfdistill: the target's own continuations, cached by their inputs."""

import json
import os

import numpy as np
import pytest

import specdec
from specdec.data.tokenizer import EOS_ID
from specdec.training import selfdistill
from tests.helpers import tiny_model

CFG = selfdistill.DistillConfig(rows=4, prompt_tokens=8, new_tokens=6, batch=2, seed=3)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("sd")
  model = tiny_model(eos_token_id=[EOS_ID])
  specdec.save(str(root / "target"), model)
  corpus = np.random.default_rng(0).integers(2, 64, 500).astype(np.uint16)
  np.save(root / "train.npy", corpus)
  return root, model, corpus


def split_rows(stream):
  ends = np.flatnonzero(stream == EOS_ID)
  return np.split(stream, ends[:-1] + 1)


def test_rows_are_prefixes_and_the_target_s_own_continuations(setup):
  root, model, corpus = setup
  path = selfdistill.build(str(root / "target"), str(root / "train.npy"), str(root / "a"), CFG)
  rows = split_rows(np.load(path))
  assert len(rows) == CFG.rows and all(r[-1] == EOS_ID for r in rows)
  prompts = selfdistill.prefixes(corpus, CFG)
  for row, prompt in zip(rows, prompts, strict=True):
    assert row[: CFG.prompt_tokens].tolist() == prompt
    assert 0 <= len(row) - CFG.prompt_tokens - 1 <= CFG.new_tokens  # EOS may come first
  # The first half is greedy: exactly what generate's greedy path gives for those prefixes.
  loaded = specdec.load(str(root / "target"))
  g = specdec.generate(loaded, prompts[:2], max_new_tokens=CFG.new_tokens)
  for row, out in zip(rows[:2], g.tokens, strict=True):
    assert row[CFG.prompt_tokens : -1].tolist() == [t for t in out if t != EOS_ID]
  record = json.load(open(os.path.join(root, "a", selfdistill.RECORD)))
  assert record["config"]["temperatures"] == [0.0, 0.6] and record["tokens"] == len(np.load(path))


def test_a_matching_record_reuses_the_stream_and_other_inputs_regenerate(setup, monkeypatch):
  root, _, _ = setup
  args = (str(root / "target"), str(root / "train.npy"), str(root / "b"))
  first = np.load(selfdistill.build(*args, CFG))
  calls = []
  real = selfdistill.generate_rows
  monkeypatch.setattr(selfdistill, "generate_rows", lambda *a: calls.append(1) or real(*a))
  assert np.array_equal(np.load(selfdistill.build(*args, CFG)), first) and calls == []
  other = np.load(selfdistill.build(*args, selfdistill.DistillConfig(**{**vars(CFG), "seed": 4})))
  assert calls == [1] and not np.array_equal(other, first)
  assert not any(n.endswith(".tmp") or ".tmp." in n for n in os.listdir(root / "b"))


@pytest.mark.parametrize(
  "change,match",
  [({"rows": 3}, "multiple of the 2 temperatures"), ({"new_tokens": 0}, ">= 1"),
   ({"temperatures": (-1.0, 0.0)}, "must be >= 0"), ({"prompt_tokens": 600}, "no prefix of 600")],
)  # fmt: skip
def test_bad_settings_are_named(setup, change, match):
  root, _, corpus = setup
  with pytest.raises(ValueError, match=match):
    selfdistill.DistillConfig(**{**vars(CFG), **change}).check(len(corpus))
