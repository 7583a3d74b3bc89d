"""Quality figures of a zoo: held-out perplexity, HumanEval syntax rate, tau per drafter.

Everything here is measured, on the same HumanEval prompts, with the commands in docs/zoo.md.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

import specdec
from specdec.data import humaneval_eval, workload


def heldout_ppl(model, tokens: np.ndarray, seq_len: int = 512, max_windows: int = 64) -> float:
  """exp(mean next-token cross-entropy) over non-overlapping windows of the held-out tokens."""
  n = min(max_windows, (len(tokens) - 1) // seq_len)
  windows = np.stack([tokens[i * seq_len : (i + 1) * seq_len + 1] for i in range(n)]).astype(
    np.int32
  )
  nll = []
  for i in range(0, n, 8):
    w = windows[i : i + 8]
    logp = jax.nn.log_softmax(model.logits(w[:, :-1]), -1)
    nll.append(-np.asarray(jnp.take_along_axis(logp, w[:, 1:, None], -1))[..., 0])
  return float(math.exp(np.concatenate(nll).mean()))


def humaneval_syntax(model, max_new_tokens: int = 192, batch: int = 16, n: int | None = None):
  """(share that ast.parse accepts, share with a non-empty body that parses) of greedy completions.

  An empty completion after the docstring parses too (the docstring is a body), so the second
  figure, which needs at least one statement beyond the prompt, is the honest one.
  """
  prompts = [p.text for p in workload.select(workload.load_humaneval(), n)]
  completions = []
  for i in range(0, len(prompts), batch):
    completions += specdec.generate(
      model, prompts[i : i + batch], max_new_tokens=max_new_tokens
    ).texts
  ok = [humaneval_eval.parses(p, c) for p, c in zip(prompts, completions, strict=True)]
  body = [humaneval_eval.truncate_completion(c).strip() != "" for c in completions]
  return sum(ok) / len(ok), sum(o and b for o, b in zip(ok, body, strict=True)) / len(ok)


# The zoo issue's bars: tau at T = 0, k = 8, block drafters at one forward's drafts (k = b - 1,
# or b for DSpark, whose anchor row drafts too); DFlash2 and DSpark at least block8's tau.
TAU_BARS = {"eagle3": 4.0, "mtp": 4.0, "block8": 4.0, "block16": 4.5, "draft_lm": 3.0}
PER_FORWARD = {"block8": 7, "block16": 15, "dflash2": 7, "dspark": 8}


def quality_ks(name: str, ks=(4, 8)) -> tuple[int, ...]:
  """k values a drafter is measured at: ks, and a block drafter's drafts per forward too."""
  p = PER_FORWARD.get(name)
  return tuple(sorted({*ks, p})) if p else tuple(ks)


def bar_k(name: str) -> int:
  return PER_FORWARD.get(name, 8)


def tau_table(target, drafters: dict, ks=(4, 8), temperatures=(0.0, 0.6), n_prompts=16,
              max_new_tokens=96, top_p=0.95, kinds=None) -> list[dict]:  # fmt: skip
  """tau and acceptance rate per (drafter, k, T) on the first n HumanEval prompts (k per
  `quality_ks` of the drafter's zoo model: kinds[name], or the name itself)."""
  kinds = kinds or {}
  prompts = [p.text for p in workload.select(workload.load_humaneval(), n_prompts)]
  rows = []
  for name, drafter in drafters.items():
    for k in quality_ks(kinds.get(name, name), ks):
      for t in temperatures:
        g = specdec.generate(
          target, prompts, max_new_tokens=max_new_tokens, temperature=t,
          top_p=top_p if t else 1.0, drafter=drafter, k=k, seed=0,
        )  # fmt: skip
        rows.append(dict(drafter=name, k=k, temperature=t, tau=g.stats["tau"],
                         tau_accepted=g.stats["tau_accepted"],
                         acceptance_rate=g.stats["acceptance_rate"]))  # fmt: skip
  return rows


def bar_checks(rows: list[dict]) -> list[dict]:
  """Each bar of TAU_BARS (and DFlash2, DSpark >= block8) against the greedy rows at the bar's
  k."""
  tau = {
    r["drafter"]: r["tau"] for r in rows if r["temperature"] == 0 and r["k"] == bar_k(r["drafter"])
  }
  bars = {
    **TAU_BARS,
    **({n: tau["block8"] for n in ("dflash2", "dspark")} if "block8" in tau else {}),
  }
  return [
    dict(drafter=name, k=bar_k(name), tau=tau[name], bar=bar, met=tau[name] >= bar)
    for name, bar in bars.items()
    if name in tau
  ]
