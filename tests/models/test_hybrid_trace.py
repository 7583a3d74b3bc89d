"""The hybrid stack's forward traces and lowers one layer per kind (mixer and MLP), not every
layer; that each layer still runs with its own weights, the golden tests against transformers check
(tests/models/test_hybrid_golden.py: three Gated DeltaNet layers in one stack)."""

import jax
import jax.numpy as jnp

from specdec.model import forward
from specdec.models import gated_deltanet, hybrid, hybrid_layers
from tests.helpers import lowerings_of, tiny_hybrid_model

# Two of each kind: (Gated DeltaNet, dense MLP) and (gated attention, routed experts).
KW = dict(num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2)


def test_layers_of_one_kind_share_a_trace(monkeypatch):
  model = tiny_hybrid_model(**KW)
  calls = {"conv": 0, "attend": 0}
  conv, attend = gated_deltanet.gdn.causal_conv, hybrid_layers.attend

  def counted_conv(*a, **kw):
    calls["conv"] += 1
    return conv(*a, **kw)

  def counted_attend(*a, **kw):
    calls["attend"] += 1
    return attend(*a, **kw)

  jax.clear_caches()  # no trace of these shapes left by an earlier test
  monkeypatch.setattr(gated_deltanet.gdn, "causal_conv", counted_conv)
  monkeypatch.setattr(hybrid_layers, "attend", counted_attend)
  tokens_BT = jnp.arange(18).reshape(2, 9) % model.config.vocab_size
  jax.make_jaxpr(lambda p: forward(p, tokens_BT, model.config, jnp.float32))(model.params)
  assert calls == {"conv": 1, "attend": 1}


def test_layers_of_one_kind_share_a_lowering(monkeypatch):
  model = tiny_hybrid_model(**KW)
  tokens_BT = jnp.arange(18).reshape(2, 9) % model.config.vocab_size
  fn = lambda p: forward(p, tokens_BT, model.config, jnp.float32)  # noqa: E731
  assert lowerings_of(monkeypatch, "apply_layer", fn, model.params) == 2


def test_first_of_kind_keeps_the_kind():
  c = tiny_hybrid_model(**KW).config
  assert [hybrid.first_of_kind(c, i) for i in range(4)] == [0, 1, 0, 1]
  for i in range(4):
    j = hybrid.first_of_kind(c, i)
    assert (c.layer_types[j], c.moe_layers[j]) == (c.layer_types[i], c.moe_layers[i])
