"""The zoo's hybrid target (issue 25): Qwen3-Next architecture, 4 layers on the family's schedule
(3 Gated DeltaNet, then 1 gated full attention with partial RoPE), dense MLP, hidden 48, tied
embeddings, the zoo target's tokenizer, vocabulary and 4096 positions.

  python -m experiments.train_lm --config=configs/train_hybrid.py --corpus_dir=runs/corpus \
      --out=runs/zoo/hybrid

The zoo target's recipe (train_target.py: corpus, 4000 steps x 4 x 4096 tokens, optimizer, best
held-out export) with this model. Its size is the zoo's budget: with its MTP head it has the
~1.2 MiB the 48 MiB zoo had left, most of it the 8192 x 48 embedding (docs/zoo.md). A step is
4.2 s on a 2-core CPU (bf16), so it trains on the GPU (experiments/device/zoo_call.sh).
"""

import ml_collections

from configs import train_target


def get_config():
  c = train_target.get_config()
  c.model = ml_collections.ConfigDict(
    dict(
      model_type="qwen3_next",
      vocab_size=8192,
      hidden_size=48,
      intermediate_size=96,
      num_hidden_layers=4,
      layer_types=["linear_attention"] * 3 + ["full_attention"],
      num_attention_heads=2,
      num_key_value_heads=1,
      head_dim=32,
      partial_rotary_factor=0.25,
      linear_num_key_heads=2,
      linear_num_value_heads=4,
      linear_key_head_dim=16,
      linear_value_head_dim=16,
      linear_conv_kernel_dim=4,
      num_experts=0,  # the family's dense-MLP variant
      max_position_embeddings=4096,
      rope_theta=10000.0,
      rms_norm_eps=1e-6,
      tie_word_embeddings=True,
      eos_token_id=0,  # specdec.data.tokenizer.EOS_ID
    )
  )
  return c
