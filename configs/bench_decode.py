"""Decode-speed benchmark (experiments/bench_decode.py): a Qwen3-8B shape and a 27B-class dense
shape at B = 1 and 8, contexts 1k and 8k, bf16 / NVFP4 / EXL3-4bit; verify width and attention
implementations on the 8B shape; the loop's overhead under two XLA command-buffer settings; an 8B
B = 1 decode step under XLA_FLAGS arms (interleaved processes); cold and cached compile. Random
weights (speed does not depend on the values).

`--config=configs/bench_decode.py:tiny` is every part on a 1-layer toy shape with one cell per axis:
it runs on a CPU in well under a minute (the test suite runs it) and says nothing about speed."""

import ml_collections

QWEN3_8B = dict(
  hidden_size=4096,
  intermediate_size=12288,
  num_hidden_layers=36,
  num_attention_heads=32,
  num_key_value_heads=8,
  head_dim=128,
  vocab_size=151936,
  tie_word_embeddings=False,
)
# Qwen3.6-27B's dimensions with every layer full attention (no linear-attention layers).
DENSE_27B = dict(
  hidden_size=5120,
  intermediate_size=17408,
  num_hidden_layers=64,
  num_attention_heads=24,
  num_key_value_heads=4,
  head_dim=256,
  vocab_size=248320,
  tie_word_embeddings=False,
)


TINY = dict(
  hidden_size=128,
  intermediate_size=256,
  num_hidden_layers=1,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=64,  # K * H = 128: EXL3 pads every dimension to 128
  vocab_size=256,
  tie_word_embeddings=False,
)


def get_config(preset: str = ""):
  if preset not in ("", "tiny"):
    raise ValueError(f"unknown bench_decode preset {preset!r}; choose '' or 'tiny'")
  c = ml_collections.ConfigDict()
  c.shapes = ml_collections.ConfigDict({"qwen3_8b": QWEN3_8B, "dense_27b": DENSE_27B})
  # Parts run in this order; "decode.<format>" runs one format, to put slow formats last.
  c.parts = ("copy", "decode", "verify", "attention", "loop", "flags", "compile", "profile")
  c.budget_s = 0.0  # wall seconds after which remaining cells are recorded as skipped; 0: no limit
  c.reps = 5  # timed repetitions per cell (after one warm-up); figures are median (min-max)
  c.copy_gib = 2.0
  c.copy_iters = 20

  c.shape_names = ("qwen3_8b", "dense_27b")
  c.formats = ("bf16", "nvfp4", "exl3_4")
  c.batches = (1, 8)
  c.contexts = (1024, 8192)  # KV cache slots; the XLA attention reads all of them every step
  # Decode rows' KV caches: "model" (the weights' dtype) and/or "float8_e4m3fn" (unit scales).
  c.kv_dtypes = ("model",)
  c.n_steps = 16  # decode steps per timed chunk
  # decode / verify / profile models get q/k/v and gate/up fused (specdec.models.fuse), as the
  # sweep decodes; the flags part sets it per arm.
  c.fuse = True

  c.verify = ml_collections.ConfigDict(
    dict(shape="qwen3_8b", format="bf16", widths=(1, 2, 4, 8, 16), contexts=(1024, 8192), iters=64)
  )
  c.attention = ml_collections.ConfigDict(
    dict(
      shape="qwen3_8b",
      batch=1,
      impls=("xla", "pallas", "xla_sdpa", "cudnn", "cudnn_seqlen"),
      widths=(1, 2, 4, 8, 16),
      contexts=(1024, 8192),
      iters=4,  # x the layers: each iteration calls attention once per layer
    )
  )
  c.loop = ml_collections.ConfigDict(
    dict(
      shape="qwen3_8b",
      k=4,
      prompt_tokens=1024,
      n_steps=32,
      slope_n=(32, 128),  # the empty loop's trip counts: per-iteration cost = slope between them
      # One subprocess per arm; '' is XLA's default command-buffer set, the empty list turns
      # command buffers (CUDA graphs) off.
      xla_flags=("", "--xla_gpu_enable_command_buffer="),
    )
  )
  # Decode arms (XLA_FLAGS, fuse q/k/v and gate/up[, attention path "auto" | "xla"]), a process
  # per leg and arm, interleaved; by default the attention kernel against XLA's einsum.
  c.flags = ml_collections.ConfigDict(
    dict(
      shape="qwen3_8b",
      format="bf16",
      batch=1,
      context=1024,
      legs=2,
      arms=(("", True, "auto"), ("", True, "xla")),
    )
  )
  c.compile = ml_collections.ConfigDict(
    dict(shape="qwen3_8b", format="bf16", batch=1, context=1024)
  )
  # A profiler trace of the decode step: which kernels take the time the roofline does not explain.
  c.profile = ml_collections.ConfigDict(
    dict(shape="qwen3_8b", formats=("bf16", "nvfp4"), batch=1, context=1024, top=30)
  )
  if preset == "tiny":
    _tiny(c)
  return c


def _tiny(c):
  c.shapes = ml_collections.ConfigDict({"tiny": TINY})
  c.shape_names = ("tiny",)
  c.reps = 2
  c.copy_gib = 0.001
  c.copy_iters = 2
  c.batches = (2,)
  c.contexts = (16,)
  c.kv_dtypes = ("model", "float8_e4m3fn")
  c.n_steps = 2
  c.verify.update(shape="tiny", widths=(1, 3), contexts=(16,), iters=2)
  c.attention.update(shape="tiny", impls=("xla", "xla_sdpa"), widths=(3,), contexts=(16,), iters=2)
  c.loop.update(shape="tiny", prompt_tokens=8, n_steps=2, slope_n=(2, 4))
  # The command-buffer arm alone: it checks that this XLA accepts the flag (bad flags abort).
  c.loop.xla_flags = ("--xla_gpu_enable_command_buffer=",)
  c.compile.update(shape="tiny", context=16)
  c.profile.update(shape="tiny", formats=("bf16",), context=16)
  c.flags.update(shape="tiny", context=16, legs=1)
  c.flags.arms = (("", True, "xla"), ("--xla_gpu_enable_triton_gemm=false", False))
