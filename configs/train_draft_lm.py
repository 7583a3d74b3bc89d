"""The zoo's draft LM: one layer, under 10% of the target's parameters, distilled from the target.

  python -m experiments.train_lm --config=configs/train_draft_lm.py --corpus_dir=runs/corpus \
      --out=runs/zoo/draft_lm [--config.teacher=runs/zoo/target]

Pure KL to the target's soft distribution (distill_alpha = 1) on the target's own continuations
(the zoo build points train_file at the self-distilled stream): acceptance depends on matching the
target, not the data. Most of its parameters are the embedding (8192 x 104). Same tokenizer, vocabulary and context as the target
(the draft_lm drafter keeps its own cache at the target's positions); the best held-out KL is
exported.
"""

from configs import train_target


def get_config():
  c = train_target.get_config()
  c.model.update(
    dict(
      hidden_size=104,
      intermediate_size=384,
      num_hidden_layers=1,
      num_attention_heads=2,
      num_key_value_heads=1,
      head_dim=64,
    )
  )
  c.teacher = "runs/zoo/target"
  c.distill_alpha = 1.0
  c.lr = 2e-3
  return c
