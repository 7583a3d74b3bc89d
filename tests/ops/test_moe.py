"""Routed experts: both grouped matmuls equal a dense one-hot reference; routing renormalizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.ops import moe


def _weights(I=6, D=8, F=5, seed=0):
  ks = jax.random.split(jax.random.key(seed), 3)
  return (
    jax.random.normal(ks[0], (I, D, F)),
    jax.random.normal(ks[1], (I, D, F)),
    jax.random.normal(ks[2], (I, F, D)),
  )


def _dense(x, w, ids, gate, up, down):
  """Every expert on every token, weighted by a one-hot of the routing."""
  h = jax.nn.silu(jnp.einsum("MD,IDF->MIF", x, gate)) * jnp.einsum("MD,IDF->MIF", x, up)
  y = jnp.einsum("MIF,IFD->MID", h, down)
  mix = jnp.einsum("Me,MeI->MI", w, jax.nn.one_hot(ids, gate.shape[0]))
  return jnp.einsum("MID,MI->MD", y, mix)


@pytest.mark.parametrize("M", [1, 3, 40])
@pytest.mark.parametrize("impl", [None, "ragged", "gather"])
def test_grouped_matmuls_match_the_dense_reference(M, impl):
  gate, up, down = _weights()
  x = jax.random.normal(jax.random.key(M), (M, 8))
  logits = jax.random.normal(jax.random.key(M + 1), (M, 6))
  w, ids = moe.route(logits, 2, normalize=True)
  got = moe.experts(x, w, ids, gate, up, down, implementation=impl)
  np.testing.assert_allclose(got, _dense(x, w, ids, gate, up, down), rtol=1e-5, atol=1e-4)


def test_route_picks_the_top_experts_and_renormalizes():
  logits = jnp.array([[0.0, 3.0, 1.0, 2.0]])
  w, ids = moe.route(logits, 2, normalize=True)
  assert ids.tolist() == [[1, 3]]
  p = jax.nn.softmax(logits)[0]
  np.testing.assert_allclose(w[0], p[jnp.array([1, 3])] / (p[1] + p[3]), rtol=1e-6)
  w_raw, _ = moe.route(logits, 2, normalize=False)
  np.testing.assert_allclose(w_raw[0], p[jnp.array([1, 3])], rtol=1e-6)


def test_unknown_implementation_is_refused():
  gate, up, down = _weights()
  x, w, ids = jnp.zeros((1, 8)), jnp.ones((1, 2)), jnp.zeros((1, 2), jnp.int32)
  with pytest.raises(ValueError, match="MoE implementation 'megablocks'"):
    moe.experts(x, w, ids, gate, up, down, implementation="megablocks")


PICKS = [("cpu", 3, "gather"), ("gpu", 3, "ragged"), ("gpu", 1, "gather"), ("cpu", 4, "ragged")]


@pytest.mark.parametrize("backend, M, picked", PICKS)
def test_the_default_picks_by_rows_times_choices_against_the_backend_s_crossover(
  monkeypatch, backend, M, picked
):
  """I = 6 experts, e = 2: gather while M e <= 6 on a CPU, <= 3 on a GPU."""
  calls = []
  monkeypatch.setattr(moe.jax, "default_backend", lambda: backend)
  for name in ("_gather", "_ragged"):
    monkeypatch.setattr(moe, name, lambda *a, name=name: calls.append(name[1:]))
  gate, up, down = _weights()
  ids = jnp.zeros((M, 2), jnp.int32)
  moe.experts(jnp.zeros((M, 8)), jnp.ones((M, 2)), ids, gate, up, down)
  assert calls == [picked]
