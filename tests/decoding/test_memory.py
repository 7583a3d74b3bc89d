"""Sizing the decode state from device memory: bytes per slot, the plan, and where it is enforced
(generate and the sweep's per-cell checks), all before anything compiles."""

import jax
import jax.numpy as jnp
import pytest

import specdec
from specdec.decoding import memory
from specdec.decoding.compiles import CompileCounter
from specdec.decoding.memory import DeviceMemory, GiB, MemoryPlanError
from specdec.drafters import draft_lm, null
from specdec.lab import driver
from specdec.lab.sweep import SweepError
from specdec.models.config import load_config
from tests.helpers import tiny_config, tiny_model
from tests.lab.test_sweep import small_config

MiB = 1 << 20
ZOO = "specdec/zoo"


@pytest.mark.parametrize(
  "config, dtype, hand",
  [
    # The zoo target: L=12, K=2 kv heads of H=64 (D/N = 256/8 = 32): 2 * 12 * 2 * 64 * 2 bytes.
    (load_config(f"{ZOO}/target"), jnp.bfloat16, 6144),
    (load_config(f"{ZOO}/target"), jnp.float8_e4m3fn, 3072),
    # GQA down to one kv head, H=40 != D/N=12: 2 * 2 * 1 * 40 * 4.
    (tiny_config(num_key_value_heads=1, head_dim=40), jnp.float32, 640),
    # MHA (K = N = 4), H = D/N = 12: 2 * 2 * 4 * 12 * 2.
    (tiny_config(num_key_value_heads=4, head_dim=12), jnp.float16, 384),
  ],
)
def test_kv_slot_bytes_by_hand(config, dtype, hand):
  assert memory.kv_slot_bytes(config, dtype) == hand


@pytest.fixture(scope="module")
def zoo():
  load = specdec.load
  return load(f"{ZOO}/target", dtype=jnp.float32), load(f"{ZOO}/draft_lm", dtype=jnp.float32)


@pytest.mark.parametrize("kv_dtype", [None, jnp.bfloat16, jnp.float8_e4m3fn])
def test_measured_state_per_slot_is_the_kv_formula_plus_a_token_id(zoo, kv_dtype):
  target, draft = zoo
  kv = memory.kv_slot_bytes(target.config, kv_dtype or target.dtype)
  slot, other = memory.state_cost(target, null(), 0, 3, 64, 128, kv_dtype)
  assert slot == kv + 4  # + the int32 token buffer
  assert 0 < other < 64 * 1024  # counters and lengths, not a cache
  # A draft LM brings its own cache: its K/V per slot on top.
  slot_lm, _ = memory.state_cost(target, draft_lm(draft), 4, 3, 64, 128, kv_dtype)
  assert slot_lm == slot + memory.kv_slot_bytes(draft.config, draft.dtype)


def test_plan_fits_and_refuses_naming_the_numbers():
  # 0.9 x 10 GiB - 2 GiB resident = 7 GiB; B=4 x 1 MiB per slot: 1792 slots.
  mem = DeviceMemory(limit_bytes=10 * GiB, in_use_bytes=2 * GiB)
  assert memory.plan_slots(1792, 4, MiB, mem, fraction=0.9) == 1792
  with pytest.raises(MemoryPlanError) as e:
    memory.plan_slots(1856, 4, MiB, mem, fraction=0.9, params_bytes=GiB, kv_bytes=MiB - 4)
  msg = str(e.value)
  for part in (
    "B=4 x 1856 slots x 1,048,576 bytes per slot (target KV 1,048,572)",
    "7.250 GiB needed, 7.000 GiB available",
    "fraction 0.9 x 10.000 GiB limit - 2.000 GiB resident, params 1.000 GiB",
    "at most 1792 slots fit at B=4",
  ):
    assert part in msg
  # Params not yet placed still count: resident is the larger of in-use and params.
  assert memory.plan_slots(64, 4, MiB, mem, fraction=0.9, params_bytes=5 * GiB) == 1024
  # Fixed state comes off the top, and so do params still to be built (named in the error).
  assert memory.plan_slots(64, 4, MiB, mem, fraction=0.9, other_bytes=GiB) == 1536
  assert memory.plan_slots(64, 4, MiB, mem, fraction=0.9, extra_bytes=GiB) == 1536
  with pytest.raises(MemoryPlanError, match="params 0.000 GiB [+] 7.000 GiB still to be built"):
    memory.plan_slots(64, 4, MiB, mem, fraction=0.9, extra_bytes=7 * GiB)
  with pytest.raises(ValueError, match="memory_fraction must be in"):
    memory.plan_slots(64, 4, MiB, mem, fraction=1.5)


def test_plan_slots_grow_with_the_fraction():
  mem = DeviceMemory(limit_bytes=80 * GiB, in_use_bytes=16 * GiB)
  fractions = [0.2, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0]
  slots = []
  for f in fractions:
    try:
      slots.append(memory.plan_slots(1, 8, 147_456, mem, fraction=f))
    except MemoryPlanError:
      slots.append(0)  # below the resident params nothing fits
  assert slots[0] == 0 and slots == sorted(slots) and slots[-1] > slots[-2] > slots[1] > 0


def _fake_device(monkeypatch, model, available):
  """A device whose budget at the default fraction leaves `available` bytes beside the params."""
  in_use = memory.tree_bytes(model.params)
  limit = int((in_use + available) / memory.DEFAULT_FRACTION) + 1
  monkeypatch.setattr(memory, "device_memory", lambda: DeviceMemory(limit, in_use))


def test_generate_refuses_before_compiling_and_runs_when_it_fits(monkeypatch):
  model = tiny_model(seed=3)
  prompts = [[1, 2, 3]] * 4
  kw = dict(max_new_tokens=32, drafter=specdec.drafters.ngram(), k=4)
  # 4 rows x 64 slots (16 bucket + 32 new + 4 + 1, to 64s) x (2*2*2*16*4 + 4) bytes = 129 KiB.
  _fake_device(monkeypatch, model, available=100 * 1024)
  with CompileCounter() as built, pytest.raises(MemoryPlanError) as e:
    specdec.generate(model, prompts, **kw)
  assert "B=4 x 64 slots x 516 bytes per slot (target KV 512)" in str(e.value)
  assert built.count == 0
  ref = specdec.generate(model, prompts, **kw, memory_fraction=None)
  _fake_device(monkeypatch, model, available=140 * 1024)
  assert specdec.generate(model, prompts, **kw).tokens == ref.tokens
  with pytest.raises(ValueError, match="memory_fraction must be in"):
    specdec.generate(model, prompts, max_new_tokens=32, memory_fraction=0)


def test_without_memory_stats_nothing_is_planned_unless_given_a_budget():
  if jax.devices()[0].memory_stats() is not None:
    pytest.skip("this backend keeps memory stats")
  model = tiny_model()
  assert memory.device_memory() is None
  assert memory.check_fits(model, null(), 0, 1, 16, 64) is None
  # An explicit budget plans anyway: 0.9 x 1 MiB less the params (not placed: in use 0).
  slot, other = memory.state_cost(model, null(), 0, 1, 16, 64)
  assert slot == 516
  fit = int((0.9 * MiB - memory.tree_bytes(model.params) - other) // slot)
  mem = DeviceMemory(limit_bytes=MiB, in_use_bytes=0)
  assert memory.check_fits(model, null(), 0, 1, 16, 64, memory=mem) == fit > 64


def test_sweep_refuses_an_oversized_cell_before_running(monkeypatch, tmp_path):
  target = specdec.load(small_config().target, dtype=jnp.float32)
  # Room for B=1 at 576 slots (512 bucket + 8 new + k + 1), not for B=2.
  slot = memory.kv_slot_bytes(target.config, jnp.float32) + 4
  _fake_device(monkeypatch, target, available=int(1.5 * 576 * slot))
  out = tmp_path / "run"
  with pytest.raises(SweepError, match=r"cell null k=0 prompt_tokens=0: .*B=2 x 576 slots"):
    driver.run(small_config(batches=(1, 2), n_prompts=4), str(out), progress=False)
  assert not (out / "results.jsonl").exists()
