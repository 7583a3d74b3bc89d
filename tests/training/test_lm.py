"""LM pretraining and export (specdec.training.lm) and the experiments.train_lm entry point.

One tiny model shape serves the in-process tests, so that they share compiled programs.
"""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from configs import train_draft_lm
from specdec.data import corpus, tokenizer
from specdec.model import Model
from specdec.training import data, lm, loop
from tests.helpers import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
V = 64  # the structured corpus's alphabet
CONFIG = tiny_config(vocab_size=512, eos_token_id=0)  # 512: the small tokenizer's vocabulary


def progressions(n_tokens, seed=0):
  """Arithmetic progressions mod V-2 with a random start, stride and length, EOS-separated: the
  next token is predictable once a row has shown its stride."""
  rng = np.random.default_rng(seed)
  out = []
  while sum(map(len, out)) < n_tokens:
    a, s, n = rng.integers(V), rng.integers(1, 4), rng.integers(16, 48)
    out.append(np.append(2 + (a + s * np.arange(n)) % (V - 2), tokenizer.EOS_ID))
  return np.concatenate(out)[:n_tokens].astype(np.uint16)


def test_lm_loss_falls_on_a_structured_corpus():
  config = CONFIG
  batches = data.TokenWindows(progressions(40_000), batch_size=8, seq_len=32, seed=0)
  params = lm.init_params(config, seed=0)
  _, h = loop.fit(
    lm.make_loss(config, jnp.float32),
    params,
    batches,
    optimizer=loop.adamw(3e-3, steps=100, warmup=10),
    steps=100,
    log_every=10,
    progress=False,
  )
  first, last = h["train"][0]["loss"], h["train"][-1]["loss"]
  assert first > 5.0  # the mean over steps 1-10, starting near ln 512 = 6.2
  assert last < 0.5 * first, (first, last)
  assert h["train"][-1]["acc"] > 0.5


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
  """A small slice of the real thing: stdlib text, a 512-token BPE, train/heldout token arrays."""
  d = tmp_path_factory.mktemp("corpus")
  texts = [(corpus.stdlib_root() / p).read_text() for p in ("textwrap.py", "colorsys.py")]
  tok = tokenizer.train_tokenizer(texts, vocab_size=CONFIG.vocab_size)
  tokenizer.save_tokenizer(tok, d / "tokenizer.json")
  ids = tokenizer.encode_documents(tok, texts)
  np.save(d / "train.npy", ids[: -len(ids) // 8])
  np.save(d / "heldout.npy", ids[-len(ids) // 8 :])
  return d


def test_export_then_load_gives_identical_logits(corpus_dir, tmp_path):
  tok = tokenizer.load_tokenizer(corpus_dir)
  config = CONFIG
  params = lm.init_params(config, seed=3)
  nbytes = lm.export(str(tmp_path), config, params, tok, dtype=jnp.float32)
  assert nbytes == os.path.getsize(tmp_path / "model.safetensors")
  loaded = specdec.load(str(tmp_path), dtype=jnp.float32, fuse_projections=False)
  assert loaded.config == config
  assert loaded.tokenizer.encode("def f(x):").ids == tok.encode("def f(x):").ids
  tokens = np.random.default_rng(0).integers(0, config.vocab_size, (2, 24))
  want = Model(config, params, dtype=jnp.float32).logits(tokens)
  np.testing.assert_array_equal(np.asarray(loaded.logits(tokens)), np.asarray(want))
  jax.tree.map(np.testing.assert_array_equal, loaded.params, params)


TINY = [
  "--config.steps=20",
  "--config.model.vocab_size=512",
  "--config.model.hidden_size=32",
  "--config.model.intermediate_size=64",
  "--config.model.num_hidden_layers=2",
  "--config.model.num_attention_heads=4",
  "--config.model.num_key_value_heads=2",
  "--config.model.head_dim=8",
  "--config.model.max_position_embeddings=128",
  "--config.seq_len=64",
  "--config.batch_size=4",
  "--config.compute_dtype=float32",
  "--config.log_every=5",
  "--config.eval_every=10",
  "--config.ckpt_every=10",
  "--config.warmup=2",
]


def test_train_lm_cli_then_a_draft_distilled_from_its_export(corpus_dir, tmp_path):
  target, draft = tmp_path / "target", tmp_path / "draft_lm"
  cmd = [sys.executable, "-m", "experiments.train_lm", "--config=configs/train_target.py"]
  cmd += [f"--corpus_dir={corpus_dir}", f"--out={target}", *TINY]
  r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  record = json.loads((target / "training.json").read_text())
  evals = record["history"]["eval"]
  assert [e["step"] for e in evals] == [10, 20]
  assert evals[-1]["heldout_ppl"] == pytest.approx(np.exp(evals[-1]["heldout_ce"]))
  assert record["exported"]["step"] == min(evals, key=lambda e: e["heldout_loss"])["step"]
  assert record["history"]["train"][-1]["loss"] < record["history"]["train"][0]["loss"]
  model = specdec.load(str(target))
  assert model.tokenizer is not None and model.config.eos_token_ids == (0,)
  assert model.config.hidden_size == 32 and model.dtype == jnp.bfloat16
  assert (tmp_path / "target_ckpt" / "20").is_dir()

  # The draft config, distilled from that export (in-process: a second interpreter costs seconds).
  cfg = train_draft_lm.get_config()
  for flag in TINY:
    key, value = flag.removeprefix("--config.").split("=")
    *parents, leaf = key.split(".")
    node = functools.reduce(getattr, parents, cfg)
    setattr(node, leaf, type(getattr(node, leaf))(value))
  cfg.model.hidden_size, cfg.model.num_hidden_layers, cfg.teacher = 16, 1, str(target)
  draft_model, history = lm.train(cfg, str(corpus_dir), str(draft))
  assert {"heldout_kl", "heldout_agree"} <= set(history["eval"][-1])
  assert history["train"][-1]["kl"] < history["train"][0]["kl"]
  assert draft_model.config.num_layers == 1 and draft_model.tokenizer is not None
  assert json.loads((draft / "training.json").read_text())["config"]["teacher"] == str(target)
