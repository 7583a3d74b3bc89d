"""The generic training loop (specdec.training.loop): resume exactness, history, schedule."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specdec.training import data, loop

V, D = 32, 8
STEPS = 30


def stream():
  return np.random.default_rng(0).integers(0, V, 4000).astype(np.uint16)


def batches():
  return data.TokenWindows(stream(), batch_size=4, seq_len=8, seed=0)


def init():
  k1, k2 = jax.random.split(jax.random.key(1))
  return {
    "emb": jax.random.normal(k1, (V, D)),
    "out": jax.random.normal(k2, (D, V)),
    "b": jnp.zeros(V),
  }


def loss_fn(params, frozen, tokens_BT, key):
  """Predict the next token through a bottleneck; input noise from `key` makes the key matter."""
  x_BTD = params["emb"][tokens_BT[:, :-1]] + 0.1 * jax.random.normal(
    key, (*tokens_BT.shape[:1], 7, D)
  )
  logits_BTV = x_BTD @ (params["out"] * frozen["scale"]) + params["b"]
  ce = optax.softmax_cross_entropy_with_integer_labels(logits_BTV, tokens_BT[:, 1:]).mean()
  return ce, {"ce": ce}


FROZEN = {"scale": jnp.float32(0.5)}


def run(ckpt_dir, steps=STEPS, it=None, **kw):
  kw = dict(ckpt_every=10, log_every=5, eval_every=15, progress=False, frozen=FROZEN) | kw
  return loop.fit(
    loss_fn,
    init(),
    it or batches(),
    optimizer=loop.adamw(3e-2, steps=STEPS, warmup=5),
    steps=steps,
    ckpt_dir=ckpt_dir,
    eval_fn=lambda p: {"norm": optax.tree.norm(p)},
    **kw,
  )


class Killed(Exception):
  pass


class DiesAfter:
  """A batch iterator that raises after n batches, as a killed job would stop."""

  def __init__(self, inner, n):
    self.inner, self.n = inner, n

  def __iter__(self):
    return self

  def __next__(self):
    if self.n == 0:
      raise Killed
    self.n -= 1
    return next(self.inner)

  def get_state(self):
    return self.inner.get_state()

  def set_state(self, state):
    self.inner.set_state(state)


def assert_same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  return run(str(tmp_path_factory.mktemp("full")))


def test_loss_goes_down_and_history_is_logged(uninterrupted):
  _, h = uninterrupted
  assert [e["step"] for e in h["train"]] == [5, 10, 15, 20, 25, 30]
  assert h["train"][-1]["loss"] < h["train"][0]["loss"]
  assert {"loss", "ce", "grad_norm", "tokens_per_s"} <= set(h["train"][0])
  assert [e["step"] for e in h["eval"]] == [15, 30] and "norm" in h["eval"][0]
  assert h["compile_s"] > 0


def test_killed_run_resumes_to_the_same_params(uninterrupted, tmp_path):
  ckpt = str(tmp_path / "ckpt")
  with pytest.raises(Killed):
    run(ckpt, it=DiesAfter(batches(), 25))  # dies 5 steps after the checkpoint at step 20
  params, h = run(ckpt)
  assert_same(params, uninterrupted[0])
  assert h["resumed_at"] == [20]
  no_rate = lambda entries: [{k: v for k, v in e.items() if k != "tokens_per_s"} for e in entries]
  assert no_rate(h["train"]) == no_rate(uninterrupted[1]["train"])


def test_stopped_run_continues_to_the_same_params(uninterrupted, tmp_path):
  ckpt = str(tmp_path / "ckpt")
  run(ckpt, steps=12)  # a shorter run: its final checkpoint is step 12, off the 10-step grid
  params, h = run(ckpt)
  assert_same(params, uninterrupted[0])
  assert h["resumed_at"] == [12]
  # A finished run called again trains no more and returns the final params.
  again, _ = run(ckpt)
  assert_same(again, uninterrupted[0])


def test_stateless_iterator_is_replayed_on_resume(uninterrupted, tmp_path):
  def plain():  # no get_state: the loop replays it up to the checkpoint
    it = batches()
    while True:
      yield next(it)

  ckpt = str(tmp_path / "ckpt")
  run(ckpt, steps=10, it=plain())
  params, _ = run(ckpt, it=plain())
  assert_same(params, uninterrupted[0])


def test_step_traces_once_and_takes_frozen_as_an_argument():
  traces = []

  def counting(params, frozen, batch, key):
    traces.append(1)
    return loss_fn(params, frozen, batch, key)

  for scale in (0.5, 2.0):  # another frozen value, same executable shape
    loop.fit(
      counting, init(), batches(), steps=5, frozen={"scale": jnp.float32(scale)}, progress=False
    )
  assert len(traces) == 2  # once per fit call, not once per step


def test_on_eval_sees_each_result_with_its_step():
  seen = []
  loop.fit(
    loss_fn,
    init(),
    batches(),
    steps=6,
    frozen=FROZEN,
    eval_fn=lambda p: {"x": 1.0},
    eval_every=3,
    on_eval=lambda p, h: seen.append(dict(h["eval"][-1])),
    progress=False,
  )
  assert seen == [{"step": 3, "x": 1.0}, {"step": 6, "x": 1.0}]


def test_warmup_cosine_schedule():
  s = loop.warmup_cosine(1.0, steps=100, warmup=10, end_ratio=0.1)
  assert float(s(0)) == pytest.approx(0.1)
  assert float(s(10)) == pytest.approx(1.0)
  assert float(s(55)) == pytest.approx(0.55, abs=1e-6)
  assert float(s(100)) == pytest.approx(0.1)
  assert float(loop.warmup_cosine(1.0, steps=10)(0)) == pytest.approx(1.0)


def test_adamw_first_step_is_lr_sized_and_decays_matrices_only():
  opt = loop.adamw(0.1, steps=10, warmup=0, weight_decay=0.5, clip=1e9)
  params = {"w": jnp.ones((2, 2)), "scale": jnp.ones(2)}
  zero = jax.tree.map(jnp.zeros_like, params)
  updates, _ = opt.update(zero, opt.init(params), params)
  np.testing.assert_allclose(updates["w"], -0.1 * 0.5 * np.ones((2, 2)), rtol=1e-6)
  np.testing.assert_array_equal(updates["scale"], 0.0)
  # Adam's bias-corrected first step is lr * sign(g) whatever the gradient's scale.
  small = {"w": jnp.zeros((2, 2)), "scale": jnp.array([1e-4, -3e-3])}
  updates, _ = opt.update(small, opt.init(params), params)
  np.testing.assert_allclose(updates["scale"], [-0.1, 0.1], rtol=1e-3)


def test_progress_line_gives_an_eta_from_measured_steps_and_the_compile_apart(capsys):
  run(None, progress=True)
  err = capsys.readouterr().err
  line = [part for part in err.split("\r") if "ETA" in part][-1]
  assert "30/30 steps" in line and "from measured steps and evals" in line
  assert re.search(r"ETA 0:00 .*\(compile \d+\.\d s\)", line), line
