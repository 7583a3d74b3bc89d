"""The zoo's draft LM: 2.9M params (5.5 MiB in bf16), distilled from the target.

  python -m experiments.train_lm --config=configs/train_draft_lm.py --corpus_dir=runs/corpus \
      --out=runs/zoo/draft_lm [--config.teacher=runs/zoo/target]

Pure KL to the target's soft distribution on the training corpus (distill_alpha = 1): acceptance
depends on matching the target, not the data. Same tokenizer, vocabulary and context as the target
(the draft_lm drafter keeps its own cache at the target's positions); the best held-out KL is
exported.
"""

from configs import train_target


def get_config():
  c = train_target.get_config()
  c.model.update(
    dict(
      hidden_size=192,
      intermediate_size=512,
      num_hidden_layers=3,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=64,
    )
  )
  c.teacher = "runs/zoo/target"
  c.distill_alpha = 1.0
  c.lr = 2e-3
  return c
