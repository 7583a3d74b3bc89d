import gzip
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


def test_extend_to_length_with_workload_filler():
  prompts = [wl.Prompt(str(i), f"prompt number {i} " * 3) for i in range(6)]
  ids = byte_tokenize(prompts[2].text)
  out = wl.extend_to_length(ids, 200, wl.workload_filler(prompts, 2), byte_tokenize)
  assert len(out) == 200
  assert out[-len(ids) :] == ids
  prefix = bytes(out[: -len(ids)]).decode()
  # Fillers 3, 4, 5, 0 in turn; the last one used sits whole next to the prompt.
  assert prefix.endswith("prompt number 5 " * 3 + "\n\n" + "prompt number 0 " * 3 + "\n\n")
  assert "prompt number 2" not in prefix  # the prompt never fills its own context
  assert wl.extend_to_length(ids, 10, [], byte_tokenize) == ids


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
