"""The peer benchmark (specdec/bench/peers.py): interleaving, shared random weights, rows,
tables, config errors. The transformers side needs torch, which the test environment lacks; the
end-to-end test runs where an interpreter with torch + transformers is found
($SPECDEC_TORCH_PYTHON, .venv-ref).
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from configs import bench_peers
from specdec import metrics
from specdec.bench import peers, peers_torch
from specdec.checkpoint import names
from specdec.lab import results
from tests.helpers import tiny_config

ROOT = Path(__file__).resolve().parents[2]
ARM = {a.method: a for a in peers.SHAPE_ARMS + peers.ZOO_ARMS}


def _np_hashed(name, shape, seed, exp):
  """The weight rule in numpy (uint32 wraps like jnp's), HF layout."""
  idx = np.arange(math.prod(shape), dtype=np.uint32)
  b = peers_torch.hashed_bytes(idx, np.uint32(peers_torch.tensor_seed(name, seed)), lambda v: v)
  return ((b.astype(np.float32) - 128) * 2.0**-exp).reshape(shape)


def _requests(t0, ttft_s, tpot_s, n_out, count):
  """`count` back-to-back requests with the given first-token time and time per later token."""
  out, t = [], t0
  for _ in range(count):
    end = t + ttft_s + tpot_s * (n_out - 1)
    out.append(metrics.Request(t, t + ttft_s, end, n_out))
    t = end
  return out


def _cond(**kw):
  cond = {
    "part": "zoo",
    "k": 4,
    "workload": "humaneval",
    "dtype": "bfloat16",
    "prompt_tokens": 0,
    "seed": 0,
    "max_new_tokens": 4,
    "target": "zoo:target",
    "drafters": {},
    "peer": {"torch": "x", "transformers": "y", "python": "3", "device": "cpu"},
    "prompts": [[1, 2, 3], [4, 5, 6]],
  }
  cond.update(kw)
  return cond


def test_schedule_interleaves_every_arm_per_leg():
  a, b, c = peers.Arm("null"), peers.Arm("hf_greedy"), peers.Arm("ngram", "null")
  got = [(leg, arm.method) for leg, arm in peers.schedule((a, b, c), 2)]
  assert got == [(0, "null"), (0, "hf_greedy"), (0, "ngram"), (1, "null"), (1, "hf_greedy")] + [
    (1, "ngram")
  ]
  # Every drafted arm's gate reference runs before it within a leg.
  for arms in (peers.SHAPE_ARMS, peers.ZOO_ARMS):
    order = [a.method for a in arms]
    assert order[0] == "null"
    assert all(order.index(a.baseline) < order.index(a.method) for a in arms if a.baseline)


def test_hash_is_the_same_in_numpy_and_jax_and_looks_random():
  idx = np.arange(1 << 16, dtype=np.uint32)
  key = peers_torch.tensor_seed("model.embed_tokens.weight", 0)
  b_np = peers_torch.hashed_bytes(idx, np.uint32(key), lambda v: v)
  b_jx = np.asarray(peers_torch.hashed_bytes(jnp.asarray(idx), jnp.uint32(key), lambda v: v))
  np.testing.assert_array_equal(b_np, b_jx)
  # The torch path computes in int64 and masks: the same numbers from Python ints.
  b_int = peers_torch.hashed_bytes(idx.astype(np.int64), key, lambda v: v & 0xFFFFFFFF)
  np.testing.assert_array_equal(b_np, b_int)
  assert b_np.min() >= 0 and b_np.max() <= 255
  counts = np.bincount(b_np, minlength=256)
  assert counts.min() > 0.7 * counts.mean() and counts.max() < 1.3 * counts.mean()
  other = peers_torch.hashed_bytes(idx, np.uint32(peers_torch.tensor_seed("x", 0)), lambda v: v)
  assert np.mean(other == b_np) < 0.02  # another tensor name gives other values


def test_hashed_params_hold_the_hf_layout_weights_and_fingerprints_match():
  config = tiny_config()
  exp = 7
  params = peers.hashed_params(config, jnp.float32, seed=3, exp=exp)
  fps = peers.fingerprints(params, exp)
  flat = flatten_dict(params["params"])
  assert len(fps) == len(flat)
  for key, v in flat.items():
    name, transpose = names.to_hf_name("/".join(key))
    v = np.asarray(v)
    if v.ndim == 1:
      np.testing.assert_array_equal(v, 1.0)
      want = v
    else:
      hf = _np_hashed(name, v.T.shape if transpose else v.shape, 3, exp)
      want = hf.T if transpose else hf
      np.testing.assert_array_equal(v, want)
    assert fps[name] == int(np.round(want * 2.0**exp).astype(np.int64).sum()) % 2**32
  # bf16 holds the same values exactly (multiples of 2**-exp with 8 significant bits).
  bf = peers.hashed_params(config, jnp.bfloat16, seed=3, exp=exp)
  assert peers.fingerprints(bf, exp) == fps
  assert peers.fingerprints(peers.hashed_params(config, jnp.float32, 4, exp), exp) != fps


def test_check_same_weights_names_the_differing_tensors():
  peers.check_same_weights({"a": 1, "b": 2}, {"a": 1, "b": 2})
  with pytest.raises(peers.PeerError, match=r"1 tensors differ.*'b'"):
    peers.check_same_weights({"a": 1, "b": 2}, {"a": 1, "b": 3})
  with pytest.raises(peers.PeerError, match="'c'"):
    peers.check_same_weights({"a": 1}, {"a": 1, "c": 0})


def test_agreement_counts_the_common_prefix():
  ref = [[1, 2, 3, 4], [5, 6, 7, 8]]
  assert peers.agreement(ref, ref) == {"agree_share": 1.0, "identical": 2, "n": 2}
  got = peers.agreement(ref, [[1, 2, 9, 4], [5, 6, 7, 8]])
  assert got == {"agree_share": 6 / 8, "identical": 1, "n": 2}  # position 3 after a miss: no credit
  assert peers.agreement(ref, [[1, 2], [0, 6, 7, 8]])["agree_share"] == 2 / 8


def test_leg_row_rates_gate_and_schema():
  # Request 0 is a slow warm-up; the timed ones decode at 10 ms per token after a 50 ms TTFT.
  warm = metrics.Request(0.0, 5.0, 9.0, 5)
  timed = _requests(9.0, 0.05, 0.010, 5, 2)
  tokens = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
  hf = peers.LegResult([warm, *timed], [[0], *tokens], [9, 3, 2])
  outputs = {(0, "null"): [[0], *tokens], (0, "hf_greedy"): [[0], *tokens]}
  cond = _cond(prompts=[[1], [2], [3]])
  row = peers.leg_row(ARM["hf_assisted"], 0, hf, cond, outputs)
  results.validate_row(results.to_jsonable(row))
  assert row["decode_tok_s"] == pytest.approx(100.0)
  assert row["whole_tok_s"] == pytest.approx(10 / (2 * (0.05 + 0.04)))
  assert row["ttft_ms_median"] == pytest.approx(50.0)
  assert row["k"] == 4 and row["gate_passed"] and row["extra"]["framework"] == "transformers"
  assert row["extra"]["tokens_per_forward"] == pytest.approx(11 / 14)
  assert row["extra"]["identical_vs_specdec_greedy"] == 3
  assert "tau" not in row  # HF reports no histogram
  # A drafted arm whose tokens differ from its baseline fails the gate; agreement drops.
  outputs[(0, "hf_greedy")] = [[0], [1, 2, 3, 4, 0], tokens[1]]
  bad = peers.leg_row(ARM["hf_assisted"], 0, hf, cond, outputs)
  assert not bad["gate_passed"]
  # A specdec arm carries the acceptance fields of its histogram; a baseline arm has k = 0.
  hist = np.array([[1, 0, 2]])  # 3 steps accepting 0, 2 and 2 drafts, none cut: 7 tokens
  counts = dict(accept_hist=hist, censored_hist=0 * hist, emitted_by_bucket=np.array([7]))
  ours = peers.LegResult([warm, *timed], [[0], *tokens], [2, 2, 2], counts=counts)
  row = peers.leg_row(ARM["null"], 0, ours, _cond(prompts=[[1], [2], [3]]), outputs)
  results.validate_row(results.to_jsonable(row))
  assert row["k"] == 0 and row["gate"] == "baseline (specdec)"
  assert row["tau"] == pytest.approx(1 + 4 / 3)
  # The same-shape baseline verifies k drafts and rejects them all; drafters are gated on it.
  row = peers.leg_row(ARM["same_shape"], 0, ours, _cond(prompts=[[1], [2], [3]]), outputs)
  assert (row["k"], row["acceptance"], row["gate_passed"]) == (4, "reject", True)
  outputs[(0, "same_shape")] = [[0], *tokens]
  row = peers.leg_row(ARM["ngram"], 0, ours, _cond(prompts=[[1], [2], [3]]), outputs)
  assert row["gate_passed"] and "same_shape" in row["gate"]
  outputs[(0, "same_shape")] = [[0], tokens[1], tokens[0]]
  assert not peers.leg_row(ARM["ngram"], 0, ours, _cond(prompts=[[1], [2], [3]]), outputs)[
    "gate_passed"
  ]


def _rows(method, decode, whole, gate=True, framework_k=0):
  return [
    {
      "method": method,
      "leg": leg,
      "k": framework_k,
      "decode_tok_s": d,
      "whole_tok_s": w,
      "ttft_ms_median": 5.0,
      "gate_passed": gate,
      "extra": {
        "framework": "transformers" if method.startswith("hf_") else "specdec",
        "tokens_per_forward": math.nan,
        "identical_vs_specdec_greedy": 2,
        "n_vs_specdec_greedy": 2,
        "agree_share_vs_specdec_greedy": 1.0,
      },
    }
    for leg, (d, w) in enumerate(zip(decode, whole, strict=True))
  ]


def test_pair_ratio_and_bar():
  rows = _rows("null", [300.0, 320.0], [250.0, 270.0]) + _rows("hf_static", [120, 130], [100, 110])
  r = peers.pair_ratio(rows, "null", "hf_static")
  assert r["ratio"] == pytest.approx(310 / 125)
  assert (r["min"], r["max"]) == pytest.approx((320 / 130, 300 / 120))
  table = peers.part_table(rows, peers.SHAPE_PAIRS, bar=1.2)
  assert "310.0 ±3.2%" in table and "bar >= 1.2x decode-only: held" in table
  assert "NOT held" in peers.part_table(rows, peers.SHAPE_PAIRS, bar=3.0)
  failed = _rows("null", [300.0, 320.0], [250.0, 270.0], gate=False) + rows[2:]
  text = peers.part_table(failed, peers.SHAPE_PAIRS, bar=1.2)
  assert "NOT held" in text and "not admissible" in text and "FAILED" in text


def _cfg(**over):
  cfg = bench_peers.get_config()
  for key, value in over.items():
    node = cfg
    *path, last = key.split(".")
    for p in path:
      node = node[p]
    node[last] = value
  return peers.normalize(cfg)


def test_default_config_validates_and_parts_parse_from_a_string():
  peers.validate(_cfg())
  # The command line gives `--config.parts=zoo,shape` as ("zoo,shape",).
  assert _cfg(parts=("zoo, shape",)).parts == ("zoo", "shape")


@pytest.mark.parametrize(
  "over, match",
  [
    ({"parts": ("shape,tree",)}, "config.parts"),
    ({"parts": ()}, "config.parts"),
    ({"legs": 1}, "config.legs=1"),
    ({"dtype": "fp16"}, "config.dtype"),
    ({"torch_device": "tpu"}, "config.torch_device"),
    ({"torch_python": "/no/such/python"}, "config.torch_python"),
    ({"shape.n_requests": 1}, "config.shape.n_requests=1"),
    ({"shape.max_new_tokens": 1}, "max_new_tokens >= 2"),
    ({"shape.prompt_tokens": 40800}, "cache room"),
    ({"shape.model.num_key_value_heads": 5}, "num_key_value_heads"),
    ({"zoo.n_prompts": 1}, "config.zoo.n_prompts=1"),
    ({"zoo.k": 0}, "k >= 1"),
    ({"zoo.ngram.min_n": 3, "zoo.ngram.max_n": 2}, "min_n <= max_n"),
    ({"zoo.draft": "zoo:nope"}, "config.zoo.draft"),
  ],
)
def test_bad_config_is_a_clear_error(over, match):
  with pytest.raises(peers.PeerError, match=match):
    peers.validate(_cfg(**over))


def _has_torch(python) -> bool:
  r = subprocess.run([python, "-c", "import torch, transformers"], capture_output=True)
  return r.returncode == 0


@pytest.mark.skipif(_has_torch(sys.executable), reason="this interpreter has torch")
def test_a_worker_without_torch_fails_with_its_import_error():
  with pytest.raises(
    peers.PeerError, match=r"(?s)failed in 'hello'.*No module named 'torch'.*torch_python"
  ):
    peers.TorchPeer("", "cpu")


def _torch_python() -> str | None:
  for python in (os.environ.get("SPECDEC_TORCH_PYTHON"), str(ROOT / ".venv-ref/bin/python")):
    if python and os.path.exists(python) and _has_torch(python):
      return python
  return None


TORCH_PYTHON = _torch_python()
TINY = {
  "hidden_size": 48,
  "intermediate_size": 96,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 16,
  "vocab_size": 64,
  "max_position_embeddings": 512,
}


@pytest.mark.skipif(TORCH_PYTHON is None, reason="no interpreter with torch + transformers")
def test_end_to_end_against_transformers_on_cpu(tmp_path):
  # float32: the two frameworks must agree token for token, which on the shape part also proves
  # both sides built the same weights in the same layout, and every gate must pass.
  cfg = _cfg(
    parts=("shape,zoo",), torch_python=TORCH_PYTHON, torch_device="cpu", dtype="float32",
    **{"shape.model": TINY, "shape.prompt_tokens": 32, "shape.max_new_tokens": 8,
       "shape.n_requests": 2, "shape.weight_exp": 7, "zoo.n_prompts": 2,
       "zoo.max_new_tokens": 8},
  )  # fmt: skip
  text = peers.run(cfg, str(tmp_path))
  rows = results.load_rows(tmp_path / "results.jsonl")
  arms = [a.method for a in peers.SHAPE_ARMS + peers.ZOO_ARMS]
  assert [r["method"] for r in rows] == arms[:2] * 2 + arms[2:] * 2  # legs interleaved per part
  assert [r["leg"] for r in rows] == [0, 0, 1, 1] + [0] * 7 + [1] * 7
  for r in rows:
    results.validate_row(r)
    assert r["gate_passed"] and r["n_requests_timed"] == 1
    assert r["decode_tok_s"] > 0 and r["whole_tok_s"] > 0
    assert r["extra"]["identical_vs_specdec_greedy"] == 2
  by = {(r["leg"], r["method"]): r for r in rows}
  assert by[(0, "hf_static")]["completion_tokens"] == 8  # no EOS: the full budget
  assert (
    by[(0, "draft_lm")]["tau"] > 1 and by[(0, "hf_assisted")]["extra"]["tokens_per_forward"] > 1
  )
  assert "null / hf_static" in text and "draft_lm / hf_assisted" in text
  assert (tmp_path / "peers.md").read_text().strip() == text.strip()
  with pytest.raises(peers.PeerError, match="already holds results"):
    peers.run(cfg, str(tmp_path))
