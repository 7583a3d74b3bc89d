"""On the fake 4-device platform, a sweep with config.tensor_parallel = 2 (of a bf16 target and of
its NVFP4 and FP8 quantizations), or with its cells spread over 3 local devices (config.devices:
4 groups of cells, so one device runs two), writes the outputs a single-device sweep writes (same
gate, same tokens)."""

import pytest

from specdec.lab import driver, results
from specdec.lab.sweep import SweepError
from tests.helpers import random_exl3
from tests.lab.test_sweep import small_config


def _outputs(out):
  rows = results.load_rows(out / results.RESULTS_NAME)
  return {
    (r["target_format"], r["method"], r["k"], r["prompt_tokens"], r["leg"]): (
      r["extra"]["output_sha"],
      r["gate_passed"],
    )
    for r in rows
  }


def test_tensor_parallel_sweep_matches_the_single_device_sweep(tmp_path, capsys):
  cfg = dict(target_formats=("bf16", "nvfp4", "fp8"))
  driver.run(small_config(**cfg), str(tmp_path / "one"), progress=False)
  driver.run(small_config(tensor_parallel=2, **cfg), str(tmp_path / "tp2"), progress=False)
  one, tp2 = _outputs(tmp_path / "one"), _outputs(tmp_path / "tp2")
  assert one == tp2 and len(one) == 3 * 6 and all(ok for _, ok in one.values())
  # Compiled ahead under the mesh, quantized targets too: the timed calls build nothing.
  rows = results.load_rows(tmp_path / "tp2" / results.RESULTS_NAME)
  assert {c["compiles"] for r in rows for c in r["extra"]["calls"] if c["timed"]} == {0}
  assert "compiled ahead 0 executables" not in capsys.readouterr().err


def test_cells_spread_over_local_devices_match_the_single_device_sweep(tmp_path):
  cfg = dict(prompt_tokens=(0, 64))  # 4 groups of cells (context x leg)
  driver.run(small_config(**cfg), str(tmp_path / "one"), progress=False)
  driver.run(small_config(devices=3, **cfg), str(tmp_path / "many"), progress=False)
  one, many = _outputs(tmp_path / "one"), _outputs(tmp_path / "many")
  assert one == many and len(one) == 12
  rows = results.load_rows(tmp_path / "many" / results.RESULTS_NAME)
  assert len({(r["method"], r["k"], r["prompt_tokens"], r["leg"]) for r in rows}) == len(rows)


def test_a_mesh_the_target_cannot_split_over_is_one_clear_error(tmp_path, monkeypatch):
  from specdec.lab import sweep

  with pytest.raises(SweepError, match="config.tensor_parallel=3: tensor=3 does not divide"):
    driver.run(small_config(tensor_parallel=3), str(tmp_path / "tp3"), progress=False)
  # Random EXL3 codes stand in for the quantizer's (minutes of search on a CPU): the refusal
  # reads the weights' shapes only.
  real = sweep.quantized

  def fast(model, fmt):
    return random_exl3(model) if fmt.startswith("exl3") else real(model, fmt)

  monkeypatch.setattr(sweep, "quantized", fast)
  with pytest.raises(SweepError, match="config.tensor_parallel=2 with target format 'exl3_4'"):
    driver.run(
      small_config(tensor_parallel=2, target_formats=("fp8", "exl3_4")), str(tmp_path / "q"), False
    )
  with pytest.raises(SweepError, match=r"config.devices=5: must be an int in \[1, 4\]"):
    driver.run(small_config(devices=5), str(tmp_path / "d5"), progress=False)
