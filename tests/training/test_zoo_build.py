"""specdec.training.zoo.build: training order, what each model trains against, and resume."""

import json
import os

import ml_collections
import numpy as np
import pytest

from specdec.training import zoo


def _fake_train(calls):
  def train(cfg, corpus_dir, out, ckpt_dir):
    calls.append((os.path.basename(out), cfg.to_dict()))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "training.json"), "w") as f:
      json.dump({}, f)

  return train


def test_build_trains_in_order_and_resumes_after_finished_models(tmp_path, monkeypatch):
  calls, distilled = [], []
  monkeypatch.setattr(zoo.lm, "train", _fake_train(calls))
  monkeypatch.setattr(zoo.drafter, "train", _fake_train(calls))

  def fake_distill(target, corpus, out_dir, cfg):
    distilled.append((target, corpus, cfg))
    return os.path.join(out_dir, "distill.npy")

  monkeypatch.setattr(zoo.selfdistill, "build", fake_distill)
  out = str(tmp_path / "zoo")

  def configs():
    c = {name: ml_collections.ConfigDict() for name in zoo.MODELS}
    return {**c, "selfdistill": ml_collections.ConfigDict({"rows": 8, "seed": 1})}

  os.makedirs(f"{out}/target")
  open(f"{out}/target/model.safetensors", "w").close()  # exported, not finished: retrained
  assert zoo.build(configs(), "corpus", out, "ckpt") == list(zoo.MODELS)
  trained = dict(calls)
  assert trained["draft_lm"]["teacher"] == f"{out}/target"
  for head in zoo.DRAFTERS["target"][1:]:
    assert trained[head]["target"] == os.path.abspath(f"{out}/target")
  assert trained["hybrid_mtp"]["target"] == os.path.abspath(f"{out}/hybrid")
  # One self-distilled stream per target, from the target just trained, feeds its drafters; the
  # targets themselves train on the corpus.
  assert [d[0] for d in distilled] == [f"{out}/target", f"{out}/hybrid"]
  assert (distilled[0][2].rows, distilled[0][2].seed) == (8, 1)
  streams = {t: os.path.abspath(f"ckpt/{zoo.DATA[t]}/distill.npy") for t in zoo.DRAFTERS}
  assert streams["target"] == os.path.abspath("ckpt/selfdistill/distill.npy")
  assert {name: c.get("train_file") for name, c in trained.items()} == {
    "target": None,
    "hybrid": None,
    **{name: streams[t] for t, drafters in zoo.DRAFTERS.items() for name in drafters},
  }

  assert zoo.build(configs(), "corpus", out, "ckpt") == []  # every model finished
  os.remove(f"{out}/eagle3/training.json")
  assert zoo.build(configs(), "corpus", out, "ckpt") == ["eagle3"]
  assert zoo.build(configs(), "corpus", out, "ckpt", retrain=True) == list(zoo.MODELS)


def test_build_picks_models_and_refuses_unknown_ones_or_a_missing_target(tmp_path, monkeypatch):
  calls, distilled = [], []
  monkeypatch.setattr(zoo.lm, "train", _fake_train(calls))
  monkeypatch.setattr(zoo.drafter, "train", _fake_train(calls))
  monkeypatch.setattr(
    zoo.selfdistill, "build", lambda t, c, o, cfg: distilled.append(o) or f"{o}/distill.npy"
  )
  out = str(tmp_path / "zoo")
  configs = {name: ml_collections.ConfigDict() for name in (*zoo.MODELS, "selfdistill")}
  with pytest.raises(ValueError, match=r"zoo models \['eagle4'\]"):
    zoo.build(configs, "corpus", out, "ckpt", models=("eagle4",))
  with pytest.raises(ValueError, match="target of eagle3 is not finished"):
    zoo.build(configs, "corpus", out, "ckpt", models=("eagle3",))
  with pytest.raises(ValueError, match=r"hybrid: the target of hybrid_mtp .*\(models=hybrid\)"):
    zoo.build(configs, "corpus", out, "ckpt", models=("target", "hybrid_mtp"))
  with pytest.raises(ValueError, match="target of selfdistill_hybrid is not finished"):
    zoo.build(configs, "corpus", out, "ckpt", models=("selfdistill_hybrid",))
  assert calls == [] and distilled == []
  assert zoo.build(configs, "corpus", out, "ckpt", models=("target", "selfdistill")) == ["target"]
  assert len(distilled) == 1  # the data alone
  assert zoo.build(configs, "corpus", out, "ckpt", models=("eagle3",)) == ["eagle3"]
  assert [name for name, _ in calls] == ["target", "eagle3"]
  # The hybrid pair alone, against the dense target already there: the hybrid's own data.
  models = ("hybrid", "hybrid_mtp")
  assert zoo.build(configs, "corpus", out, "ckpt", models=models) == list(models)
  assert distilled[-1] == "ckpt/selfdistill_hybrid"


def test_side_by_side_runs_jobs_at_a_time_logs_each_and_names_failures(tmp_path):
  import sys

  def cmd(name, code):  # records its start and end times, then exits with `code`; the 1 s sleep
    # outlasts a loaded machine's gap between two processes' starts
    script = (
      "import sys, time; t = time.time(); time.sleep(1.0); "
      f"print('{name}', t, time.time()); sys.exit({code})"
    )
    return [sys.executable, "-c", script]

  cmds = {"a": cmd("a", 0), "b": cmd("b", 3), "c": cmd("c", 0)}
  assert zoo.side_by_side(cmds, 2, str(tmp_path), retry_alone=False) == ["b"]
  spans = {}
  for name in cmds:
    words = (tmp_path / f"{name}.log").read_text().split()
    assert words[0] == name
    spans[name] = (float(words[1]), float(words[2]))
  assert spans["a"][0] < spans["b"][1] and spans["b"][0] < spans["a"][1]  # a and b overlap
  assert spans["c"][0] >= min(spans["a"][1], spans["b"][1])  # c waited for a free slot


def test_side_by_side_reruns_a_failure_alone_and_names_what_failed_again(tmp_path):
  import sys

  def cmd(name, fail_first: bool):  # fails on its first run only, or always
    marker = tmp_path / f"{name}.ran"
    script = (
      f"import pathlib, sys; m = pathlib.Path({str(marker)!r}); first = not m.exists(); "
      f"m.touch(); print('{name}'); sys.exit(3 if first or not {fail_first} else 0)"
    )
    return [sys.executable, "-c", script]

  fine = [sys.executable, "-c", "print('fine')"]
  cmds = {"flaky": cmd("flaky", True), "broken": cmd("broken", False), "fine": fine}
  assert zoo.side_by_side(cmds, 3, str(tmp_path)) == ["broken"]
  assert (tmp_path / "flaky.retry.log").read_text().strip() == "flaky"  # rerun, alone, passed
  assert (tmp_path / "broken.retry.log").exists() and not (tmp_path / "fine.retry.log").exists()


def test_build_zoo_refuses_an_unknown_model_in_one_line(tmp_path):
  import subprocess
  import sys

  cmd = [
    sys.executable,
    "-m",
    "experiments.build_zoo",
    f"--corpus_dir={tmp_path}",
    "--models=bogus",
  ]
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert "--models: each must be one of target, draft_lm" in proc.stderr
  assert not any(tmp_path.iterdir())


def test_build_trains_an_ablation_as_its_zoo_model_into_its_own_directory(tmp_path, monkeypatch):
  calls, heads = [], []
  monkeypatch.setattr(zoo.lm, "train", _fake_train(calls))
  monkeypatch.setattr(zoo.drafter, "train", _fake_train(heads))
  monkeypatch.setattr(zoo.selfdistill, "build", lambda t, c, o, cfg: f"{o}/distill.npy")
  out = str(tmp_path / "zoo")
  configs = {name: ml_collections.ConfigDict() for name in (*zoo.MODELS, "selfdistill")}
  configs["lm_wide"] = ml_collections.ConfigDict()
  configs["head_corpus"] = ml_collections.ConfigDict({zoo.SELF_DISTILLED: False})
  kinds = {"lm_wide": "draft_lm", "head_corpus": "block8"}
  with pytest.raises(ValueError, match=r"zoo models \['head_corpus'\]"):  # not told its kind
    zoo.build(configs, "corpus", out, "ckpt", models=("target", "head_corpus"))
  with pytest.raises(ValueError, match="ablation of a target"):
    zoo.build(configs, "corpus", out, "ckpt", models=("target",), kinds={"t2": "target"})
  models = ("target", "head_corpus", "lm_wide")
  assert zoo.build(configs, "corpus", out, "ckpt", models=models, kinds=kinds) == [
    "target", "lm_wide", "head_corpus",
  ]  # fmt: skip
  trained = dict(calls + heads)
  assert trained["lm_wide"]["teacher"] == f"{out}/target"  # a draft LM: distilled, as draft_lm
  assert trained["lm_wide"]["train_file"] == os.path.abspath("ckpt/selfdistill/distill.npy")
  assert trained["head_corpus"]["target"] == os.path.abspath(f"{out}/target")
  assert "train_file" not in trained["head_corpus"]  # the recipe's own file: the corpus's
  assert [name for name, _ in heads] == ["head_corpus"]
  assert os.path.exists(f"{out}/lm_wide/training.json")


def _shrunk(cfg, **kw):
  """A zoo recipe cut to a few CPU steps on short windows; its model and method unchanged."""
  cfg.update(dict(steps=4, seq_len=64, batch_size=2, warmup=1, log_every=1, ckpt_every=4, **kw))
  return cfg


def test_the_hybrid_pair_builds_end_to_end_on_a_toy_corpus(tmp_path):
  """The hybrid target by the zoo target's recipe, its data, its MTP head by the MTP recipe: real
  training (4 steps each) and exports that `specdec.load` / `load_drafter` read; the target
  shares the dense target's tokenizer.json as a link."""
  from configs.zoo import CONFIGS
  from specdec.data import corpus, tokenizer

  texts = [(corpus.stdlib_root() / p).read_text() for p in ("textwrap.py", "colorsys.py")]
  tok = tokenizer.train_tokenizer(texts, vocab_size=512)
  corpus_dir, out = tmp_path / "corpus", tmp_path / "zoo"
  for d in (corpus_dir, out / "target"):
    d.mkdir(parents=True)
    tokenizer.save_tokenizer(tok, d / "tokenizer.json")
  (out / "target" / "training.json").write_text("{}")  # the dense target, finished
  ids = tokenizer.encode_documents(tok, texts)
  np.save(corpus_dir / "train.npy", ids[: -len(ids) // 8])
  np.save(corpus_dir / "heldout.npy", ids[-len(ids) // 8 :])
  head = _shrunk(
    CONFIGS["hybrid_mtp"].get_config(), eval_every=4, eval_prompts=2, eval_prompt_len=16,
    eval_k=3, eval_new_tokens=8, dtype="float32",
  )  # fmt: skip
  head.drafter.chain.update(dict(depth=2, origins=8))  # compiles in seconds
  configs = {
    "hybrid": _shrunk(
      CONFIGS["hybrid"].get_config(), eval_every=4, eval_batches=1, compute_dtype="float32"
    ),
    "hybrid_mtp": head,
    "selfdistill": dict(rows=8, prompt_tokens=16, new_tokens=48, temperatures=(0.0,), batch=8),
  }
  models = ("hybrid", "hybrid_mtp")
  assert zoo.build(configs, str(corpus_dir), str(out), str(tmp_path / "ckpt"), models=models) == [
    *models
  ]
  import jax.numpy as jnp

  import specdec
  from specdec.drafters.mtp import MTP

  target = specdec.load(str(out / "hybrid"), dtype=jnp.float32)
  hf = json.loads((out / "hybrid" / "config.json").read_text())
  assert hf["architectures"] == ["Qwen3NextForCausalLM"] and target.config.num_layers == 4
  assert target.config.layer_types == ("linear_attention",) * 3 + ("full_attention",)
  assert os.readlink(out / "hybrid" / "tokenizer.json") == "../target/tokenizer.json"
  assert target.tokenizer.get_vocab() == tok.get_vocab()
  record = json.loads((out / "hybrid_mtp" / "training.json").read_text())
  assert record["train_file"].endswith("selfdistill_hybrid/distill.npy")
  head = specdec.load_drafter(str(out / "hybrid_mtp"), target)
  assert isinstance(head, MTP) and head.spec.layout == "qwen3_next"
  prompts = [ids[:40].tolist(), ids[100:125].tolist()]
  want = specdec.generate(target, prompts, max_new_tokens=12).tokens
  assert specdec.generate(target, prompts, max_new_tokens=12, drafter=head, k=3).tokens == want


def test_a_model_holding_its_target_s_tokenizer_links_to_it(tmp_path):
  for name, vocab in (("target", "a"), ("draft_lm", "a"), ("other", "b")):
    os.makedirs(tmp_path / name)
    (tmp_path / name / "tokenizer.json").write_text(json.dumps({"vocab": vocab}))
  for name in ("draft_lm", "other"):
    zoo.share_tokenizer(str(tmp_path / name), str(tmp_path / "target"))
  assert os.readlink(tmp_path / "draft_lm" / "tokenizer.json") == "../target/tokenizer.json"
  assert not os.path.islink(tmp_path / "other" / "tokenizer.json")  # a different tokenizer stays
