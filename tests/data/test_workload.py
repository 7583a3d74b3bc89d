import gzip
import hashlib
import json

import pytest

from specdec.data import workload as wl


def byte_tokenize(text):
  """A tiny fake tokenizer: one token per UTF-8 byte, vocab 256."""
  return list(text.encode("utf-8"))


def test_humaneval_loads_and_hash_matches():
  prompts = wl.load_humaneval()
  assert len(prompts) == 164
  assert prompts[0].id == "HumanEval/0"
  assert prompts[0].text.startswith("from typing import List")


def test_humaneval_hash_mismatch_names_file_and_hashes(tmp_path):
  src = gzip.decompress(wl.humaneval_path().read_bytes())
  bad = tmp_path / "HumanEval.jsonl.gz"
  bad.write_bytes(gzip.compress(src.replace(b"List", b"list", 1)))
  with pytest.raises(wl.WorkloadError) as e:
    wl.load_humaneval(bad)
  msg = str(e.value)
  assert str(bad) in msg and wl.HUMANEVAL_SHA256 in msg
  assert "sha256" in msg and len([w for w in msg.split() if len(w.strip(",;")) == 64]) == 2


def test_prompt_file_jsonl_and_sharegpt(tmp_path):
  p = tmp_path / "mixed.jsonl"
  recs = [
    {"prompt": "plain prompt", "id": "a"},
    {"conversations": [{"from": "system", "value": "sys"}, {"from": "human", "value": "hi"}]},
    {"conversations": [{"from": "user", "value": "first"}, {"from": "gpt", "value": "x"}]},
  ]
  p.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
  got = wl.load_prompt_file(p)
  assert [x.text for x in got] == ["plain prompt", "hi", "first"]
  assert got[0].id == "a" and got[1].id == "mixed/1"


def test_multi_turn_records_give_a_prompt_per_turn(tmp_path):
  p = tmp_path / "mt.jsonl"
  recs = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
    {"id": "q2", "turns": ["Only one."]},
    {"conversations": [
      {"from": "human", "value": "a"}, {"from": "gpt", "value": "recorded"},
      {"from": "human", "value": "b"},
    ]},
  ]  # fmt: skip
  p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
  got = wl.load_prompt_file(p)
  assert got == [
    wl.Prompt("81/turn1", "Write a poem."),
    wl.Prompt("81/turn2", "Now shorter.", history=("Write a poem.",)),
    wl.Prompt("q2", "Only one."),
    wl.Prompt("mt/2/turn1", "a"),
    wl.Prompt("mt/2/turn2", "b", history=("a",)),  # the recorded reply is not the model's own
  ]
  p.write_text(json.dumps({"turns": ["ok", 3]}) + "\n")
  with pytest.raises(wl.WorkloadError, match="record 1 has no string 'prompt', no list"):
    wl.load_prompt_file(p)


def test_render_prompt_with_earlier_turns():
  history = [("Q1?", " A1."), ("Q2?", " A2.")]
  assert wl.render_prompt("Q3?", history=history) == "Q1? A1.\n\nQ2? A2.\n\nQ3?"
  seen = {}

  def renderer(template, messages):
    seen["messages"] = messages
    return "rendered"

  assert wl.render_prompt("Q3?", "T", renderer=renderer, history=history) == "rendered"
  assert [(m["role"], m["content"]) for m in seen["messages"]] == [
    ("user", "Q1?"), ("assistant", " A1."), ("user", "Q2?"), ("assistant", " A2."),
    ("user", "Q3?"),
  ]  # fmt: skip


def test_prompt_file_json_array_gz(tmp_path):
  p = tmp_path / "share.json.gz"
  recs = [{"id": "q1", "conversations": [{"from": "human", "value": "hello"}]}]
  p.write_bytes(gzip.compress(json.dumps(recs).encode()))
  assert wl.load_prompt_file(p) == [wl.Prompt("q1", "hello")]


def test_prompt_file_errors(tmp_path):
  p = tmp_path / "bad.jsonl"
  p.write_text('{"prompt": "ok"}\n{"nope": 1}\n')
  with pytest.raises(wl.WorkloadError, match="record 2"):
    wl.load_prompt_file(p)
  p.write_text('{"prompt": "ok"}\n{broken\n')
  with pytest.raises(wl.WorkloadError, match=r"bad.jsonl:2"):
    wl.load_prompt_file(p)
  with pytest.raises(wl.WorkloadError, match="cannot read"):
    wl.load_prompt_file(tmp_path / "missing.jsonl")


def test_render_prompt_hook():
  assert wl.render_prompt("def f():") == "def f():"
  seen = {}

  def renderer(template, messages):
    seen["args"] = (template, messages)
    return f"<user>{messages[0]['content']}</user>"

  assert wl.render_prompt("x", "TEMPLATE", renderer=renderer) == "<user>x</user>"
  assert seen["args"] == ("TEMPLATE", [{"role": "user", "content": "x"}])


def test_render_prompt_jinja_default():
  try:
    import jinja2  # noqa: F401
  except ImportError:
    with pytest.raises(wl.WorkloadError, match="jinja2"):
      wl.render_prompt("x", "{{ messages[0].content }}")
    return
  template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
  assert wl.render_prompt("x", template) == "<user>x"


def test_select():
  prompts = [wl.Prompt(str(i), str(i)) for i in range(20)]
  assert wl.select(prompts) == prompts
  assert wl.select(prompts, 3) == prompts[:3]
  a = wl.select(prompts, 5, seed=7)
  assert a == wl.select(prompts, 5, seed=7)
  assert a != wl.select(prompts, 5, seed=8)
  assert len(set(a)) == 5 and a == sorted(a, key=lambda p: int(p.id))
  assert wl.select(prompts, 50) == prompts


def test_source_documents_are_jax_files_never_trained_on():
  from specdec.data import corpus

  docs = wl.source_documents()
  assert len(docs) == 94 and all(d.document for d in docs)
  assert [d.id for d in docs] == sorted(d.id for d in docs)
  assert docs[0].id == "jax/_src/ad_checkpoint.py" and docs[0].text.startswith("# Copyright")
  assert all(d.id.startswith("jax/_src/") and len(d.text) >= wl.SOURCE_MIN_BYTES for d in docs)
  assert wl.load_workload(wl.SOURCE_WORKLOAD) == docs and wl.is_document_workload("jax_source")
  assert not wl.is_document_workload("humaneval")
  # The zoo's corpus is the stdlib with its tests, site-packages left out: no document is one of
  # its files.
  root = corpus.stdlib_root()
  kept, _ = corpus.list_source_files(root, include_tests=True)
  stdlib = {hashlib.sha256((root / p).read_bytes()).digest() for p in kept}
  assert len(stdlib) > 1000
  assert not {hashlib.sha256(d.text.encode()).digest() for d in docs} & stdlib


def test_source_documents_refuse_other_bytes(monkeypatch):
  wl.source_documents.cache_clear()
  monkeypatch.setattr(wl, "SOURCE_SHA256", "0" * 64)
  with pytest.raises(wl.WorkloadError, match=r"94 jax/_src/\*.py files .* expected 0{64}"):
    wl.source_documents()
  monkeypatch.setattr(wl, "SOURCE_VERSION", "0.0.1")
  with pytest.raises(wl.WorkloadError, match="jax==0.0.1; 0.11.2 is installed"):
    wl.source_documents()
  wl.source_documents.cache_clear()


def test_document_prompt_is_its_first_n_tokens():
  doc = wl.source_documents()[3].text
  full = byte_tokenize(doc)
  for n in (10, 1000, 4000):
    ids = wl.prompt_ids(doc, byte_tokenize, target_len=n, document=True)
    assert ids == full[:n]
  rep = wl.prompt_ids(
    doc, byte_tokenize, target_len=50, document=True, repetition=1, vocab_size=256
  )
  assert len(rep) == 50 and rep[1] != full[1] and rep[2:] == full[2:50]
  with pytest.raises(wl.WorkloadError, match="has 3 tokens, fewer than the 5 asked"):
    wl.prompt_ids("abc", byte_tokenize, target_len=5, document=True)


def test_extend_to_length_with_source_filler():
  docs = wl.source_documents()
  ids = byte_tokenize("def f(x):")
  out = wl.extend_to_length(ids, 200, wl.source_filler(2), byte_tokenize)
  assert len(out) == 200 and out[-len(ids) :] == ids
  # The filler is the end of document 2, then the blank line that separates filler pieces.
  assert bytes(out[: -len(ids)]) == (docs[2].text + "\n\n").encode()[-(200 - len(ids)) :]
  other = wl.extend_to_length(ids, 200, wl.source_filler(3), byte_tokenize)
  assert other != out  # each prompt index starts at another document
  # Long contexts run through several documents instead of running out.
  long = wl.extend_to_length(ids, 100_000, wl.source_filler(93), byte_tokenize)
  assert len(long) == 100_000 and (docs[0].text + "\n\n").encode() in bytes(long)
  assert wl.extend_to_length(ids, 5, [], byte_tokenize) == ids


def test_extend_to_length_runs_out_of_filler():
  with pytest.raises(wl.WorkloadError, match="needed"):
    wl.extend_to_length([1, 2], 100, ["short"], byte_tokenize)


def test_text_source(tmp_path):
  p = tmp_path / "book.txt"
  p.write_text("para one\nline two\n\n\npara two\n")
  assert wl.load_text_source(p) == ["para one\nline two", "para two"]


def test_substitute_for_repetition():
  ids = [1, 50, 60, 70]
  assert wl.substitute_for_repetition(ids, 0, 256) == ids
  reps = [wl.substitute_for_repetition(ids, r, 256) for r in range(6)]
  assert len({tuple(r) for r in reps}) == 6  # pairwise distinct
  for r in reps[1:]:
    assert r[0] == 1 and r[2:] == ids[2:]  # only position 1 changes; BOS kept
  assert reps[1] == wl.substitute_for_repetition(ids, 1, 256)  # deterministic
  assert wl.substitute_for_repetition(ids, 1, 256, avoid={51, 52})[1] == 53
  assert wl.substitute_for_repetition([255, 255], 1, 256)[1] == 0  # wraps
  assert wl.substitute_for_repetition([9], 2, 256) == [11]
  assert wl.substitute_for_repetition([0, 1], 2, 3) == [0, 0]
  with pytest.raises(ValueError, match="distinct"):
    wl.substitute_for_repetition([0, 1], 3, 3)
  with pytest.raises(ValueError, match="outside"):
    wl.substitute_for_repetition(ids, 1, 8)


def test_prompt_ids_order():
  fill = ["abcdefghij" * 3]
  ids = wl.prompt_ids("xyz", byte_tokenize, bos_id=0, target_len=10, filler=fill)
  assert ids[0] == 0 and len(ids) == 10 and bytes(ids[-3:]) == b"xyz"
  rep = wl.prompt_ids(
    "xyz", byte_tokenize, bos_id=0, target_len=10, filler=fill, repetition=1, vocab_size=256
  )
  assert rep[0] == 0 and rep[2:] == ids[2:] and rep[1] != ids[1]
  assert wl.prompt_ids("xyz", byte_tokenize) == list(b"xyz")
  with pytest.raises(ValueError, match="vocab_size"):
    wl.prompt_ids("xyz", byte_tokenize, repetition=1)


def test_edit_loops_rename_one_identifier_per_turn_of_each_document():
  loops, docs = wl.load_workload(wl.EDIT_WORKLOAD), wl.source_documents()
  assert len(loops) == len(docs) and not wl.is_document_workload(wl.EDIT_WORKLOAD)
  for p, doc in zip(loops, docs, strict=True):
    turns = (*p.history, p.text)
    assert len(turns) == wl.EDIT_TURNS and turns[0] in doc.text
    for j in range(1, len(turns)):
      assert turns[j] != turns[j - 1] and f"_edit{j}" in turns[j] and "_edit" not in turns[0]
