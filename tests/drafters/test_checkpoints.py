"""load_drafter tells every published drafter layout apart by its files; save_drafter writes the
native layouts too, and refuses what a layout cannot hold, naming it."""

import json
import os
import shutil

import pytest

import specdec
from specdec.checkpoint.safetensors_io import CheckpointError
from specdec.drafters import block_config, eagle3
from specdec.drafters.block import block
from specdec.drafters.checkpoints import detect, save_drafter
from specdec.drafters.mtp import MTPConfig, mtp
from tests.checkpoint.test_published_drafters import HERE, target_for
from tests.helpers import tiny_model

LAYOUTS = {  # directory -> (kind, target layers)
  "tests/fixtures/dflash/dflash": ("block", 2),
  "tests/fixtures/dflash/dflash2": ("block", 2),
  "tests/fixtures/eagle3/tiny": ("eagle3", 3),
  f"{HERE}/spec_dflash2": ("block", 2),
  f"{HERE}/spec_eagle3_qwen3": ("eagle3", 3),
  f"{HERE}/spec_mtp": ("mtp", 2),
  f"{HERE}/zlab_dflash_is_causal": ("block", 2),
}


@pytest.mark.parametrize("path", list(LAYOUTS))
def test_detect_and_native_round_trip(path, tmp_path):
  kind, layers = LAYOUTS[path]
  assert detect(path) == kind
  case = os.path.basename(path)
  target = (
    target_for(case, layers) if path.startswith(HERE) else tiny_model(num_hidden_layers=layers)
  )
  d = specdec.load_drafter(path, target)
  out = str(tmp_path / "native")
  if case == "spec_eagle3_qwen3":  # fc_norm and a qwen3 layer exist only in speculators' format
    with pytest.raises(ValueError, match="legacy EAGLE-3 layout has no norm_before_fc / fc_norm"):
      save_drafter(out, d, format="native")
    return
  save_drafter(out, d, format="native")
  again = specdec.load_drafter(out, target)
  assert type(again) is type(d) and again.taps == d.taps


def test_unknown_layout_is_named(tmp_path):
  shutil.copytree("tests/fixtures/dflash/dflash", tmp_path / "x")
  with open(tmp_path / "x" / "config.json") as f:
    d = json.load(f)
  d.pop("dflash_config")
  d["architectures"] = ["Qwen3ForCausalLM"]
  with open(tmp_path / "x" / "config.json", "w") as f:
    json.dump(d, f)
  with pytest.raises(CheckpointError, match="architectures 'Qwen3ForCausalLM' is not"):
    specdec.load_drafter(str(tmp_path / "x"), tiny_model())


def test_save_refuses_what_a_layout_cannot_hold(tmp_path):
  target = tiny_model()
  with pytest.raises(ValueError, match="format 'vllm' is not one of speculators, native"):
    save_drafter(str(tmp_path / "a"), block(target, num_layers=1), format="vllm")
  qwen_mtp = mtp(target, config=MTPConfig())
  with pytest.raises(ValueError, match="in the qwen3_next layout"):
    specdec.save(str(tmp_path / "b"), qwen_mtp)
  scaled = block(target, num_layers=1)
  scaled = block(target, scaled.draft_params, scaled.cfg.replace(logit_scale=2.0))
  with pytest.raises(ValueError, match="no output_multiplier"):
    specdec.save(str(tmp_path / "c"), scaled)
  with pytest.raises(ValueError, match="has no checkpoint layout"):
    specdec.save(str(tmp_path / "d"), specdec.drafters.ngram())


def test_taps_configured_twice_or_out_of_range_are_named():
  c = tiny_model(num_hidden_layers=3).config
  with pytest.raises(ValueError, match=r"target_layer_ids \[1, 1\] repeats layer id\(s\) \[1\]"):
    block_config.make_config(c, num_layers=2, target_layer_ids=(1, 1))
  with pytest.raises(ValueError, match=r"\[1, 2, 2\] repeats layer id\(s\) \[2\]"):
    eagle3.make_config(c, aux_layer_ids=(1, 2, 2))
  with pytest.raises(ValueError, match=r"has id\(s\) \[0\] outside \[1, 3\]"):
    eagle3.make_config(c, aux_layer_ids=(0, 1, 2))
  with pytest.raises(ValueError, match="target_layer_ids \\[3\\] outside the target's 3 layers"):
    block(tiny_model(num_hidden_layers=3), num_layers=1, target_layer_ids=(3,)).validate(c, 2, 8)
