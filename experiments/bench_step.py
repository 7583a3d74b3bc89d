"""Times the draft-verify step and its parts (draft, verify, accept+commit, loop overhead).

  python -m experiments.bench_step [--target=PATH] [--draft=PATH] --ks=1,4,8 --batch=1
Without --target a random model of the given shape is used (speed does not depend on weights).
"""

import jax
import jax.numpy as jnp
from absl import app, flags

import specdec
from configs import default
from specdec import xla_env
from specdec.bench import timing
from specdec.checkpoint.zoo import resolve_path
from specdec.lab import sweep
from specdec.models.config import from_hf_dict

_TARGET = flags.DEFINE_string("target", None, "target checkpoint; default: a random model")
_DRAFT = flags.DEFINE_string("draft", None, "draft-LM checkpoint (adds the draft_lm rows)")
_ZOO = flags.DEFINE_bool("zoo", False, "the zoo target and every zoo drafter (overrides --target)")
_KS = flags.DEFINE_list("ks", ["1", "4", "8"], "draft budgets")
_BATCH = flags.DEFINE_integer("batch", 1, "rows decoded together")
_PROMPT = flags.DEFINE_integer("prompt_tokens", 64, "context length at the start")
_STEPS = flags.DEFINE_integer("n_steps", 32, "steps per timed loop")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "model dtype")
_SHAPE = flags.DEFINE_string(
  "shape", "hidden_size=256,intermediate_size=768,num_hidden_layers=6,num_attention_heads=8,"
  "num_key_value_heads=2,head_dim=64,vocab_size=8192", "random model shape (HF config keys)",
)  # fmt: skip


def main(argv):
  del argv
  xla_env.apply_defaults()
  dtype = jnp.dtype(_DTYPE.value)
  if _ZOO.value:
    target = specdec.load(resolve_path("zoo:target"), dtype=dtype)
  elif _TARGET.value:
    target = specdec.load(_TARGET.value, dtype=dtype)
  else:
    kw = {k: int(v) for k, v in (kv.split("=") for kv in _SHAPE.value.split(","))}
    config = from_hf_dict({"model_type": "qwen3", "max_position_embeddings": 8192, **kw})
    target = specdec.Model.random(config, dtype=dtype)
  drafters = {"ngram": specdec.drafters.ngram()}
  if _DRAFT.value:
    drafters["draft_lm"] = specdec.drafters.draft_lm(specdec.load(_DRAFT.value, dtype=dtype))
  if _ZOO.value:
    cfg = sweep.normalize(default.get_config())
    for name, spec in cfg.checkpoints.items():
      if sweep.setting(cfg, name, "target") == cfg.target:  # not the hybrid target's head
        drafters[name] = sweep.load_drafter(name, spec, target, dtype)
  print(f"device={jax.devices()[0].device_kind} batch={_BATCH.value} ctx={_PROMPT.value}")
  print(
    "| drafter | k | step us | draft us | verify us | accept+commit us | loop us "
    "| draft/token in target fwds |"
  )
  print("|---|---:|---:|---:|---:|---:|---:|---:|")
  for name, drafter in drafters.items():
    for k in map(int, _KS.value):
      shape = timing.Shape(_BATCH.value, k, _PROMPT.value, _STEPS.value)
      t = timing.time_step(target, drafter, shape)
      us = {key: f"{1e6 * v:.1f}" for key, v in t.items()}
      print(
        f"| {name} | {k} | {us['step']} | {us['draft']} | {us['verify']} | "
        f"{us['accept_commit']} | {us['loop']} | {t['draft_per_token_vs_target']:.3f} |"
      )


if __name__ == "__main__":
  app.run(main)
