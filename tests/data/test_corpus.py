"""The stdlib corpus and its tokenizer (specdec.data.corpus, specdec.data.tokenizer)."""

import json

import numpy as np
import pytest

from specdec.data import corpus, tokenizer


@pytest.fixture(scope="module")
def stdlib_corpus():
  return corpus.build_corpus()


@pytest.fixture(scope="module")
def stdlib_tokenizer(stdlib_corpus):
  # The full train split takes ~5 s on two cores, cheap enough to test the real thing.
  return tokenizer.train_tokenizer(stdlib_corpus.texts("train"))


def make_tree(root, files):
  for rel, content in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())


# --- file list and split -------------------------------------------------------------------------


def test_file_list_is_deterministic_and_filtered():
  kept, excluded = corpus.list_source_files()
  assert (kept, excluded) == corpus.list_source_files()
  assert kept == sorted(kept) and len(kept) > 500
  root = corpus.stdlib_root()
  for rel in kept:
    parts = rel.split("/")
    assert rel.endswith(".py")
    assert not (corpus.EXCLUDED_DIR_NAMES | corpus.TEST_DIR_NAMES) & set(parts[:-1]), rel
    assert (root / rel).stat().st_size <= corpus.MAX_FILE_BYTES, rel
  assert "os.py" in kept and "asyncio/tasks.py" in kept


def test_exclusion_rules(tmp_path):
  make_tree(
    tmp_path,
    {
      "a.py": "x = 1\n",
      "pkg/b.py": "y = 2\n",
      "pkg/notes.txt": "not python\n",
      "test/test_a.py": "",
      "pkg/tests/test_b.py": "",
      "idlelib/idle_test/test_c.py": "",
      "idlelib/run.py": "z = 3\n",
      "lib2to3/tests/data.py": "",
      "site-packages/numpy/core.py": "",
      "config-3.12-x86_64-linux-gnu/python-config.py": "",
      "_sysconfigdata__linux_x86_64-linux-gnu.py": "build_time_vars = {}\n",
      "big.py": "#" * (corpus.MAX_FILE_BYTES + 1),
      "latin1.py": b"s = '\xe9'\n",
    },
  )
  kept, excluded = corpus.list_source_files(tmp_path)
  assert kept == ["a.py", "idlelib/run.py", "latin1.py", "pkg/b.py"]
  assert dict(excluded) == {
    "_sysconfigdata__linux_x86_64-linux-gnu.py": "build-specific",
    "big.py": "too-large",
  }
  corp = corpus.build_corpus(tmp_path, check_humaneval=False)
  assert [f.path for f in corp.files] == ["a.py", "idlelib/run.py", "pkg/b.py"]
  assert ("latin1.py", "not-utf8") in corp.excluded
  with_tests, _ = corpus.list_source_files(tmp_path, include_tests=True)
  assert set(with_tests) - set(kept) == {
    "test/test_a.py", "pkg/tests/test_b.py", "idlelib/idle_test/test_c.py", "lib2to3/tests/data.py"
  }  # fmt: skip
  corp = corpus.build_corpus(tmp_path, check_humaneval=False, include_tests=True)
  assert corp.manifest()["include_tests"]


def test_split_is_a_stable_function_of_the_path(stdlib_corpus):
  # Pinned: a change of salt or hash silently moves files between train and held-out.
  assert corpus.split_of("os.py") == "train"
  assert corpus.split_of("queue.py") == "heldout"
  assert corpus.split_of("json/encoder.py") == "heldout"
  assert all(f.split == corpus.split_of(f.path) for f in stdlib_corpus.files)
  heldout = stdlib_corpus.split("heldout")
  assert 0.02 < len(heldout) / len(stdlib_corpus.files) < 0.10
  assert corpus.build_corpus().manifest() == stdlib_corpus.manifest()


def test_manifest_round_trip_and_tamper_detection(tmp_path):
  src = tmp_path / "src"
  make_tree(src, {f"m{i}.py": f"value = {i}\n" for i in range(40)})
  corp = corpus.build_corpus(src, check_humaneval=False)
  corp.write_manifest(tmp_path / "manifest.json")
  again = corpus.Corpus.from_manifest(tmp_path / "manifest.json", root=src)
  assert again.files == corp.files
  for split in corpus.SPLITS:
    assert list(again.texts(split)) == list(corp.texts(split))
  manifest = json.loads((tmp_path / "manifest.json").read_text())
  assert {f["split"] for f in manifest["files"]} <= set(corpus.SPLITS)
  (src / corp.files[0].path).write_text("value = -1\n")
  with pytest.raises(corpus.CorpusError, match="differ from the manifest"):
    list(again.texts(corp.files[0].split))


# --- HumanEval leakage ---------------------------------------------------------------------------


def test_no_humaneval_prompt_in_the_stdlib_corpus(stdlib_corpus):
  he = stdlib_corpus.humaneval
  assert he["problems"] == 164
  assert he["collisions"] == [] and he["excluded_files"] == []


def test_leak_detector_finds_and_excludes_copies(tmp_path):
  problems = corpus.humaneval_problems()
  p0, p10 = problems["HumanEval/0"], problems["HumanEval/10"]
  block = corpus.prompt_signature_docstring(p10["prompt"], p10["entry_point"])
  make_tree(
    tmp_path,
    {
      # The whole prompt, re-indented inside a class: whitespace must not hide it.
      "copied.py": "class A:\n" + "".join(f"  {line}\n" for line in p0["prompt"].splitlines()),
      # Three long docstring lines under another name.
      "paraphrased.py": 'def other(s):\n    """Other.\n\n    '
      + "\n    ".join(block[2:5])
      + '\n"""\n',
      "clean.py": "def has_close_elements(a, b):\n    return a == b\n",
    },
  )
  found = corpus.find_humaneval_collisions(
    {p.name: p.read_text() for p in tmp_path.glob("*.py")}, problems
  )
  assert [(c.task_id, c.path, c.kind) for c in found] == [
    ("HumanEval/0", "copied.py", "signature+docstring"),
    ("HumanEval/10", "paraphrased.py", "docstring"),
  ]
  corp = corpus.build_corpus(tmp_path)
  assert [f.path for f in corp.files] == ["clean.py"]
  assert corp.humaneval["excluded_files"] == ["copied.py", "paraphrased.py"]


# --- tokenizer -----------------------------------------------------------------------------------


def test_tokenizer_vocab_and_special_tokens(stdlib_tokenizer):
  assert stdlib_tokenizer.get_vocab_size() == tokenizer.VOCAB_SIZE
  assert stdlib_tokenizer.token_to_id("<|endoftext|>") == tokenizer.EOS_ID == 0
  assert stdlib_tokenizer.token_to_id("<|pad|>") == tokenizer.PAD_ID == 1


def test_tokenizer_round_trips_held_out_files(stdlib_corpus, stdlib_tokenizer):
  texts = list(stdlib_corpus.texts("heldout"))
  assert texts
  extra = ["", "  \t\n\n    x", "naïve café ✓ 日本語 🙂", "\x00\x7f\r\n"]
  for text in texts + extra:
    ids = stdlib_tokenizer.encode(text, add_special_tokens=False).ids
    assert stdlib_tokenizer.decode(ids) == text


def test_tokenizer_compresses_held_out_code(stdlib_corpus, stdlib_tokenizer):
  bpt, n_bytes, n_tokens = tokenizer.bytes_per_token(
    stdlib_tokenizer, stdlib_corpus.texts("heldout")
  )
  assert n_bytes == stdlib_corpus.stats()["heldout"]["bytes"]
  assert bpt > 3.0, bpt  # measured 3.76 with Python 3.12.1


def test_tokenizer_training_is_deterministic(stdlib_corpus):
  texts = list(stdlib_corpus.texts("train"))[:60]
  a = tokenizer.train_tokenizer(texts, vocab_size=1024)
  b = tokenizer.train_tokenizer(texts, vocab_size=1024)
  assert a.to_str() == b.to_str()


def test_save_load_and_encode_documents(tmp_path, stdlib_corpus, stdlib_tokenizer):
  tokenizer.save_tokenizer(stdlib_tokenizer, tmp_path / "tokenizer.json")
  tok = tokenizer.load_tokenizer(tmp_path)
  assert tok.to_str() == stdlib_tokenizer.to_str()
  texts = list(stdlib_corpus.texts("heldout"))[:5]
  ids = tokenizer.encode_documents(tok, texts)
  assert ids.dtype == np.uint16
  assert int((ids == tokenizer.EOS_ID).sum()) == len(texts) and ids[-1] == tokenizer.EOS_ID
  docs = np.split(ids, np.flatnonzero(ids == tokenizer.EOS_ID) + 1)[:-1]
  assert [tok.decode(d[:-1].tolist()) for d in docs] == texts
