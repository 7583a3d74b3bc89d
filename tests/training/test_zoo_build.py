"""specdec.training.zoo.build: training order, what each model trains against, and resume."""

import json
import os

import ml_collections

from specdec.training import zoo


def _fake_train(calls):
  def train(cfg, corpus_dir, out, ckpt_dir):
    calls.append((os.path.basename(out), cfg.to_dict()))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "training.json"), "w") as f:
      json.dump({}, f)

  return train


def test_build_trains_in_order_and_resumes_after_finished_models(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(zoo.lm, "train", _fake_train(calls))
  monkeypatch.setattr(zoo.drafter, "train", _fake_train(calls))
  out = str(tmp_path / "zoo")
  configs = lambda: {name: ml_collections.ConfigDict() for name in zoo.MODELS}  # noqa: E731

  os.makedirs(f"{out}/target")
  open(f"{out}/target/model.safetensors", "w").close()  # exported, not finished: retrained
  assert zoo.build(configs(), "corpus", out, "ckpt") == list(zoo.MODELS)
  trained = dict(calls)
  assert trained["draft_lm"]["teacher"] == f"{out}/target"
  for head in ("mtp", "eagle3", "block8", "block16"):
    assert trained[head]["target"] == os.path.abspath(f"{out}/target")

  assert zoo.build(configs(), "corpus", out, "ckpt") == []  # every model finished
  os.remove(f"{out}/eagle3/training.json")
  assert zoo.build(configs(), "corpus", out, "ckpt") == ["eagle3"]
  assert zoo.build(configs(), "corpus", out, "ckpt", retrain=True) == list(zoo.MODELS)
