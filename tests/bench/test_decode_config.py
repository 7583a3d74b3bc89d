"""specdec.bench.decode_config: a bad decode-benchmark config is refused before compiling."""

import pytest

from configs import bench_decode as bench_config
from specdec.bench import decode_config
from specdec.bench.random_models import BenchConfigError


@pytest.mark.parametrize(
  "override, match",
  [
    (dict(parts=("copy", "decode.fp16")), "unknown format 'fp16'"),
    (dict(parts=("copy", "prefill")), "unknown part 'prefill'"),
    (dict(formats=("bf16", "int3")), "unknown format 'int3'"),
    (dict(shape_names=("tiny", "huge")), "unknown shape 'huge'"),
    (dict(contexts=(4,)), "decode: context 4 is too small; it needs >= 8"),
    (dict(attention=dict(impls=("xla", "cudnn"))), r"\['cudnn'\] need a GPU"),
    (dict(loop=dict(xla_flags=("xla_gpu_enable_command_buffer=",))), "must start with '--'"),
    (dict(loop=dict(slope_n=(8, 4))), "two increasing trip counts"),
    (dict(flags=dict(arms=(("", True), ("xla_gpu_enable_triton_gemm=", False)))), "flags.arms"),
    (dict(flags=dict(arms=(("", True, "cudnn"),))), r"attention in \('auto', 'xla'\)"),
    (dict(flags=dict(legs=0)), "flags.legs"),
    (dict(flags=dict(context=4)), "flags: context 4 is too small"),
    (dict(kv_dtypes=("model", "int8")), "kv_dtypes: unknown 'int8'"),
  ],
)
def test_validate_refuses_bad_configs_before_compiling(override, match):
  cfg = bench_config.get_config("tiny")
  for key, value in override.items():
    if isinstance(value, dict):
      cfg[key].update(value)
    else:
      cfg[key] = value
  with pytest.raises(BenchConfigError, match=match):
    decode_config.validate(cfg)
