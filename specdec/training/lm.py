"""Next-token LM training of a decoder (the zoo's targets, dense and hybrid, and its draft LM) and
its HF export; the module is the one `specdec.models.stack` picks for the config.

Master weights are float32; each step casts them to the compute dtype (bf16 on GPU), so gradients
and optimizer state stay float32. Distillation trains against a frozen teacher Model's soft
distribution on the same tokens:
    loss = alpha * tau^2 * KL(teacher_tau || student_tau) + (1 - alpha) * CE(next token)
Forward KL makes the student cover the teacher's mass, which is what acceptance min(1, p/q) and
the greedy argmax match both reward.
"""

import dataclasses
import functools
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from specdec.checkpoint import loader
from specdec.data import tokenizer as tokenizer_lib
from specdec.model import Model, forward
from specdec.models import stack
from specdec.models.config import ModelConfig, from_hf_dict
from specdec.ops.attention import attention_path
from specdec.training import data, loop

# The projections that write into the residual stream: attention's, Gated DeltaNet's, the MLP's
# (a routed expert's down_proj is a stacked param of that name, not a kernel).
RESIDUAL_OUTPUTS = ("o_proj", "out_proj", "down_proj")
EMBED_STD = 0.02


def init_params(config: ModelConfig, seed: int = 0):
  """Float32 {"params": ...}, initialised GPT-2 style.

  The embedding is N(0, 0.02): with tied embeddings, Flax's default (std 1/sqrt(D)) makes the
  initial logit of the input token itself ~D * std = 16 nats above the rest, a "repeat the input"
  model with loss ~13 instead of ln V ~ 9. The layers that write into the residual stream start
  scaled by 1/sqrt(2L) so that its variance at init does not grow with depth.
  """
  return _init(config, jax.random.key(seed))


@functools.partial(jax.jit, static_argnames="config")
def _init(config: ModelConfig, key):
  # Jitted: op-by-op (eager) init of even a tiny model costs seconds on CPU.
  tok = jnp.zeros((1, 1), jnp.int32)
  cache = stack.empty_cache(config, 1, 1, jnp.float32)
  params = stack.decoder(config, jnp.float32).init(key, tok, tok, cache)
  scale = (2 * config.num_layers) ** -0.5
  flat = flatten_dict(params)
  for k, v in flat.items():
    if k[-2:] == ("embed", "embedding"):
      flat[k] = EMBED_STD * jax.random.normal(jax.random.fold_in(key, 1), v.shape, v.dtype)
    elif (k[-2] if k[-1] == "kernel" else k[-1]) in RESIDUAL_OUTPUTS:
      flat[k] = v * scale
  return unflatten_dict(flat)


def num_params(params) -> int:
  return sum(int(np.size(x)) for x in jax.tree.leaves(params))


def cast(params, dtype):
  return jax.tree.map(lambda p: p.astype(dtype), params)


def token_stats(params, teacher_params, tokens_BT, *, config, dtype, teacher, temperature):
  """Per-position [B, T-1] quantities for predicting tokens[:, 1:] (traced inside jit).

  teacher: (config, dtype) of the frozen teacher or None; its params come in as an argument.
  """
  logits_BTV = forward(cast(params, dtype), tokens_BT, config, dtype).logits[:, :-1]
  labels_BT = tokens_BT[:, 1:]
  logp_BTV = jax.nn.log_softmax(logits_BTV)
  pred_BT = jnp.argmax(logits_BTV, -1)
  out = {
    "ce": -jnp.take_along_axis(logp_BTV, labels_BT[..., None], -1)[..., 0],
    "acc": (pred_BT == labels_BT).astype(jnp.float32),
  }
  if teacher is not None:
    t_BTV = forward(teacher_params, tokens_BT, *teacher).logits[:, :-1]
    t_BTV = jax.lax.stop_gradient(t_BTV)
    logq_BTV = jax.nn.log_softmax(t_BTV / temperature)
    logp_tau_BTV = logp_BTV if temperature == 1.0 else jax.nn.log_softmax(logits_BTV / temperature)
    kl_BT = jnp.sum(jnp.exp(logq_BTV) * (logq_BTV - logp_tau_BTV), -1)
    out["kl"] = kl_BT * temperature**2
    out["agree"] = (pred_BT == jnp.argmax(t_BTV, -1)).astype(jnp.float32)
  return out


def objective(stats: dict, alpha: float):
  if "kl" not in stats:
    return stats["ce"]
  return alpha * stats["kl"] + (1.0 - alpha) * stats["ce"]


def _spec(teacher: Model | None):
  # Only the static parts: a Model closed over would bake its params into the executable.
  return None if teacher is None else (teacher.config, teacher.dtype)


def make_loss(config: ModelConfig, dtype, teacher: Model | None = None, alpha=1.0, temperature=1.0):
  """loss_fn(params, frozen, tokens_BT, key) for `loop.fit`; frozen = teacher.params or None."""
  kw = dict(config=config, dtype=dtype, teacher=_spec(teacher), temperature=temperature)

  def loss_fn(params, frozen, tokens_BT, key):
    del key  # the model has no dropout
    means = {k: jnp.mean(v) for k, v in token_stats(params, frozen, tokens_BT, **kw).items()}
    return objective(means, alpha), means

  return loss_fn


def make_eval(
  config: ModelConfig,
  dtype,
  heldout: data.HeldOut,
  teacher: Model | None = None,
  alpha=1.0,
  temperature=1.0,
):
  """eval_fn(params) -> {heldout_loss, heldout_ce, heldout_ppl, heldout_acc[, _kl, _agree]}."""
  kw = dict(config=config, dtype=dtype, teacher=_spec(teacher), temperature=temperature)

  @jax.jit
  def sums(params, frozen, tokens_BT, weights_B):
    stats = token_stats(params, frozen, tokens_BT, **kw)
    stats["loss"] = objective(stats, alpha)
    return {k: jnp.sum(v * weights_B[:, None]) for k, v in stats.items()}

  frozen = teacher.params if teacher is not None else None

  def eval_fn(params):
    total, rows = None, 0.0
    for tokens_BT, weights_B in heldout:
      s = sums(params, frozen, tokens_BT, weights_B)
      total = s if total is None else jax.tree.map(jnp.add, total, s)
      rows += float(weights_B.sum())
    n = rows * (heldout.windows_WT.shape[1] - 1)
    out = {f"heldout_{k}": float(v) / n for k, v in jax.device_get(total).items()}
    out["heldout_ppl"] = float(np.exp(out["heldout_ce"]))
    return out

  return eval_fn


def export(path: str, config: ModelConfig, params, tokenizer=None, dtype=jnp.bfloat16) -> int:
  """Writes the HF layout `specdec.load(path)` reads; returns the safetensors size in bytes."""
  loader.save(path, Model(config=config, params=params, tokenizer=tokenizer, dtype=dtype), dtype)
  return os.path.getsize(os.path.join(path, "model.safetensors"))


@dataclasses.dataclass
class BestExport:
  """on_eval hook: exports whenever held-out loss beats every earlier eval of the run.

  The best so far is read from the (checkpointed) history, so it survives a resume, and a step
  budget past the held-out optimum (the corpus is small; the zoo trains for many epochs) costs
  time, not quality.
  """

  path: str
  config: ModelConfig
  tokenizer: object
  dtype: object
  key: str = "heldout_loss"

  def __call__(self, params, history):
    *earlier, now = history["eval"]
    if earlier and now[self.key] >= min(e[self.key] for e in earlier):
      return
    nbytes = export(self.path, self.config, params, self.tokenizer, self.dtype)
    with open(os.path.join(self.path, "export.json"), "w") as f:
      json.dump({**now, "safetensors_bytes": nbytes}, f, indent=2)


def model_config(cfg) -> ModelConfig:
  return from_hf_dict(cfg.model.to_dict(), source="config.model")


def train(cfg, corpus_dir: str, out: str, ckpt_dir: str | None = None):
  """Trains per an ml_collections config (configs/train_*.py) and exports to `out`.

  corpus_dir: `python -m experiments.build_corpus --tokens` output (train.npy, heldout.npy,
  tokenizer.json). Checkpoints go to ckpt_dir (default `<out>_ckpt`); a re-run resumes there.
  Returns (exported Model as loaded back, history).
  """
  t0 = time.perf_counter()
  config = model_config(cfg)
  dtype, export_dtype = jnp.dtype(cfg.compute_dtype), jnp.dtype(cfg.export_dtype)
  tok = tokenizer_lib.load_tokenizer(os.path.join(corpus_dir, "tokenizer.json"))
  if tok.get_vocab_size() > config.vocab_size:
    raise ValueError(f"tokenizer: {tok.get_vocab_size()} tokens > vocab_size {config.vocab_size}")
  if cfg.seq_len > config.max_position_embeddings:
    raise ValueError(f"seq_len {cfg.seq_len} > max_position_embeddings of config.model")

  teacher = None
  if cfg.teacher:
    teacher = loader.load(cfg.teacher, dtype=dtype)
    if teacher.config.vocab_size != config.vocab_size:
      raise ValueError(f"teacher vocab {teacher.config.vocab_size} != {config.vocab_size}")

  train_file = os.path.join(corpus_dir, cfg.get("train_file", "train.npy"))
  train_tokens = data.load_tokens(train_file, cfg.train_tokens)
  heldout_tokens = data.load_tokens(os.path.join(corpus_dir, "heldout.npy"))
  batches = data.TokenWindows(train_tokens, cfg.batch_size, cfg.seq_len, cfg.seed)
  heldout = data.HeldOut(heldout_tokens, cfg.batch_size, cfg.seq_len, cfg.eval_batches)
  distill = dict(alpha=cfg.distill_alpha, temperature=cfg.distill_temperature)

  params = init_params(config, cfg.seed)
  n_params = num_params(params)
  optimizer = loop.adamw(
    cfg.lr,
    steps=cfg.steps,
    warmup=cfg.warmup,
    end_ratio=cfg.end_lr_ratio,
    weight_decay=cfg.weight_decay,
    b2=cfg.b2,
    clip=cfg.clip,
  )
  on_eval = BestExport(out, config, tok, export_dtype) if cfg.export_best else None
  params, history = loop.fit(
    make_loss(config, dtype, teacher, **distill),
    params,
    batches,
    optimizer=optimizer,
    steps=cfg.steps,
    ckpt_dir=ckpt_dir or out.rstrip("/") + "_ckpt",
    ckpt_every=cfg.ckpt_every,
    eval_fn=make_eval(config, dtype, heldout, teacher, **distill),
    eval_every=cfg.eval_every,
    on_eval=on_eval,
    log_every=cfg.log_every,
    seed=cfg.seed,
    frozen=teacher.params if teacher is not None else None,
    desc=os.path.basename(out.rstrip("/")),
  )
  if not cfg.export_best:
    export(out, config, params, tok, export_dtype)
    exported = {"step": cfg.steps}
  else:
    with open(os.path.join(out, "export.json")) as f:
      exported = json.load(f)
  record = {
    "config": cfg.to_dict(),
    "corpus_dir": corpus_dir,
    "train_file": train_file,
    "params": n_params,
    "train_tokens": int(len(train_tokens)),
    "heldout_tokens": heldout.num_tokens,
    "tokens_per_step": cfg.batch_size * cfg.seq_len,
    "epochs": cfg.steps * cfg.batch_size * cfg.seq_len / len(train_tokens),
    "exported": exported,
    "history": history,
    "wall_s": round(time.perf_counter() - t0, 1),
    "device": str(jax.local_devices()[0].device_kind),
    "attention": attention_path(),
    "jax": jax.__version__,
    "python": platform.python_version(),
  }
  with open(os.path.join(out, "training.json"), "w") as f:
    json.dump(record, f, indent=1)
  return loader.load(out, dtype=export_dtype), history
