"""The zoo build's recipes (configs/zoo.py) as the zoo issue states them:
each drafter's method builds against a 12-layer target and its loss traces; the sizes hold."""

import jax
import numpy as np
import pytest

from configs import ablations, train_draft_lm, train_target
from configs.zoo import CONFIGS
from specdec.drafters.block_config import build_target_layer_ids
from specdec.training import drafter, lm
from specdec.training.zoo import MODELS
from tests.helpers import tiny_model


def n_params(cfg) -> int:
  shapes = jax.eval_shape(lambda: lm.init_params(lm.model_config(cfg), 0))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


def test_target_and_draft_lm_sizes_and_context():
  target = lm.model_config(train_target.get_config())
  assert target.num_layers >= 12 and target.max_position_embeddings >= 4096
  assert train_target.get_config().seq_len == target.max_position_embeddings
  ratio = n_params(train_draft_lm.get_config()) / n_params(train_target.get_config())
  assert ratio <= 0.10, ratio


def test_every_zoo_model_has_a_recipe():
  assert set(MODELS) | {"selfdistill"} == set(CONFIGS)


@pytest.fixture(scope="module")
def target12():
  return tiny_model(num_hidden_layers=12, vocab_size=64)


@pytest.mark.parametrize("name", ["mtp", "eagle3", "block8", "block16", "dflash2", "dspark"])
def test_each_drafter_recipe_builds_and_its_loss_traces(target12, name):
  cfg = CONFIGS[name].get_config()
  rng = np.random.default_rng(0)
  train, held = rng.integers(0, 64, 4000), rng.integers(0, 64, 1000)
  method = drafter.build_method(cfg, target12, train, held)
  params = method.init(jax.random.key(0))
  tokens = jax.ShapeDtypeStruct((2, 64), np.int32)
  loss, metrics = jax.eval_shape(method.loss, params, method.frozen, tokens, jax.random.key(1))
  assert loss.shape == () and metrics
  opts = cfg.drafter
  if name.startswith(("block", "dflash", "dspark")):
    # DFlash: 5 taps from the second layer to the third-to-last, its own formula
    assert tuple(opts.target_layer_ids) == tuple(build_target_layer_ids(12, 5)) == (1, 3, 5, 7, 9)
  else:
    assert opts.chain.depth == 7  # EAGLE-3's training-time test, MTP chained to the same depth


@pytest.mark.parametrize("name", ["eagle3", "block8", "dspark"])
def test_a_trainer_can_export_the_speculators_format(tmp_path, target12, name):
  import json

  import specdec

  cfg = CONFIGS[name].get_config()
  cfg.export_format = "speculators"
  rng = np.random.default_rng(0)
  method = drafter.build_method(cfg, target12, rng.integers(0, 64, 4000), rng.integers(0, 64, 999))
  method.export(str(tmp_path), jax.tree.map(np.asarray, method.init(jax.random.key(0))))
  config = json.loads((tmp_path / "config.json").read_text())
  assert "speculators_model_type" in config
  assert specdec.load_drafter(str(tmp_path), target12) is not None


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in d.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
  return out


@pytest.mark.parametrize("name", sorted(ablations.ABLATIONS))
def test_each_ablation_is_its_zoo_recipe_with_only_its_keys_changed(target12, name):
  kind, changes, _ = ablations.ABLATIONS[name]
  base, cfg = (
    _flat(CONFIGS[kind].get_config().to_dict()),
    _flat(ablations.get_config(name).to_dict()),
  )
  changed = {k: v for k, v in cfg.items() if base.get(k, "absent") != v}
  assert changed == {k: v for k, v in changes.items() if base.get(k, "absent") != v}
  assert set(cfg) - set(base) <= {"self_distilled"}
  if kind != "draft_lm":  # the changed recipe still builds against a 12-layer target
    rng = np.random.default_rng(0)
    train, held = rng.integers(0, 64, 4000), rng.integers(0, 64, 1000)
    method = drafter.build_method(ablations.get_config(name), target12, train, held)
    jax.eval_shape(method.init, jax.random.key(0))


def test_an_ablation_of_a_key_the_recipe_lacks_is_refused(monkeypatch):
  monkeypatch.setitem(ablations.ABLATIONS, "typo", ("block8", {"drafter.num_layer": 3}, ""))
  with pytest.raises(KeyError, match="drafter.num_layer is not a key of the block8 recipe"):
    ablations.get_config("typo")
  with pytest.raises(ValueError, match="ablation 'nope'"):
    ablations.get_config("nope")


def test_the_hybrid_target_is_the_family_s_schedule_and_fits_the_zoo_s_last_mebibyte():
  from configs import train_hybrid
  from specdec.drafters import mtp

  cfg = train_hybrid.get_config()
  config = lm.model_config(cfg)
  assert config.model_type == "qwen3_next" and config.tie_word_embeddings
  assert config.layer_types == ("linear_attention",) * 3 + ("full_attention",)
  assert cfg.seq_len == config.max_position_embeddings == 4096
  head = jax.eval_shape(lambda: mtp.init_head(config, mtp.MTPConfig(), jax.random.key(0)))
  n_head = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(head))
  assert 2 * (n_params(cfg) + n_head) <= 1.1 * 2**20  # bf16: the zoo had ~1.26 MiB left
  assert CONFIGS["hybrid_mtp"].get_config().target == "zoo:hybrid"
