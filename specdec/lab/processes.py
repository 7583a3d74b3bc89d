"""A sweep spread over processes: which process runs which (cell, leg), and checks that they agree.

Every process expands the same config into the same ordered (leg, cell) units and takes its share:
units are grouped by the no-draft arm they are gated against (a greedy cell's gate compares its
outputs with that arm's, in the same leg), groups in order of first appearance go round-robin to
the processes, so a greedy cell always runs after its baseline in the same process and the rows do
not depend on how many processes ran them. All processes append to the one results file, each row
one locked write (`results.append_row`), so a killed process loses only its unit in flight and a
rerun with the same --out runs what is missing.

Processes are started with `jax.distributed` (`distributed`); its key-value store carries each
process's config digest, and a process whose config differs stops every process before anything
loads.
"""

import dataclasses
import hashlib
import json
from collections.abc import Callable

from specdec.lab.sweep import SweepError, baseline_key


@dataclasses.dataclass(frozen=True)
class Processes:
  index: int = 0
  count: int = 1
  # agree(name, value) publishes this process's value and returns every process's, by index.
  agree: Callable[[str, str], list[str]] | None = None


def owners(units: list, count: int, strict: bool = True) -> list[int]:
  """The process (or device) that runs each (leg, cell) unit; with `strict`, SweepError when there
  are fewer groups of units than processes (some process would have nothing to run)."""
  groups: dict = {}
  for leg, cell in units:
    groups.setdefault(baseline_key(cell, leg), len(groups))
  if strict and count > len(groups):
    raise SweepError(
      f"--num_processes={count}: more processes than the sweep's {len(groups)} groups of cells "
      "(a cell runs with its no-draft arm); use at most that many"
    )
  return [groups[baseline_key(cell, leg)] % count for leg, cell in units]


def digest(config: dict) -> str:
  return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_same_config(processes: Processes, config: dict) -> None:
  """SweepError naming every process whose config (and checkpoint fingerprints) differs from
  process 0's."""
  if processes.count == 1 or processes.agree is None:
    return
  mine = digest(config)
  seen = processes.agree("config", mine)
  differ = [i for i, d in enumerate(seen) if d != seen[0]]
  if differ:
    raise SweepError(
      f"process(es) {differ} run a different config or checkpoints than process 0 "
      f"(digests {[seen[i] for i in differ]} vs {seen[0]}); start every process with the same "
      "--config, flags and files"
    )


def distributed(coordinator: str, count: int, index: int, timeout_s: int = 300) -> Processes:
  """Joins `count` processes through jax.distributed (this one is `index`) and agrees over its
  key-value store."""
  import jax
  from jax._src import distributed as jax_distributed  # the client: no public handle to it

  if not 0 <= index < count:
    raise SweepError(f"--process_id={index}: must be in [0, --num_processes={count})")
  jax.distributed.initialize(
    coordinator_address=coordinator, num_processes=count, process_id=index,
    initialization_timeout=timeout_s,
  )  # fmt: skip
  client = jax_distributed.global_state.client

  def agree(name: str, value: str) -> list[str]:
    client.key_value_set(f"specdec/sweep/{name}/{index}", value)
    return [
      client.blocking_key_value_get(f"specdec/sweep/{name}/{i}", timeout_s * 1000)
      for i in range(count)
    ]

  return Processes(index, count, agree)
