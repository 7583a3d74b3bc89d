"""The dense stack's forward: one trace and one lowering of a layer serve every layer of the same
shapes, and each layer still runs with its own weights."""

import jax
import jax.numpy as jnp
import numpy as np

from specdec.model import forward
from specdec.models import transformer
from tests.helpers import lowerings_of, tiny_model


def test_a_forward_traces_one_layer_for_all_of_them(monkeypatch):
  model = tiny_model(num_hidden_layers=4)
  calls, attend = [], transformer.attend

  def counted(*args, **kw):
    calls.append(1)
    return attend(*args, **kw)

  jax.clear_caches()  # no trace of these shapes left by an earlier test
  monkeypatch.setattr(transformer, "attend", counted)
  tokens_BT = jnp.arange(14).reshape(2, 7) % model.config.vocab_size
  jax.make_jaxpr(lambda p: forward(p, tokens_BT, model.config, jnp.float32))(model.params)
  assert len(calls) == 1


def test_a_forward_lowers_one_layer_for_all_of_them(monkeypatch):
  model = tiny_model(num_hidden_layers=4)
  tokens_BT = jnp.arange(14).reshape(2, 7) % model.config.vocab_size
  fn = lambda p: forward(p, tokens_BT, model.config, jnp.float32)  # noqa: E731
  assert lowerings_of(monkeypatch, "apply_layer", fn, model.params) == 1


def test_each_layer_runs_with_its_own_weights():
  model = tiny_model(num_hidden_layers=3)
  c, params = model.config, model.params["params"]
  B, T = 2, 5
  tokens_BT = (jnp.arange(B * T).reshape(B, T) * 7) % c.vocab_size
  got = forward(model.params, tokens_BT, c, jnp.float32).logits
  positions_BT = jnp.broadcast_to(jnp.arange(T), (B, T))
  cache = transformer.KVCache.zeros(c, B, T, jnp.float32)
  x_BTD = jnp.take(params["embed"]["embedding"], tokens_BT, axis=0)
  for i in range(c.num_layers):  # the layers one by one, each given its own weights
    x_BTD, _, _ = transformer.Block(c).apply(
      {"params": params[f"layer_{i}"]}, x_BTD, positions_BT, cache.k[i], cache.v[i]
    )
  want = transformer.Transformer(c, jnp.float32).apply(
    model.params, x_BTD, None, method="read_out"
  )[0]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
