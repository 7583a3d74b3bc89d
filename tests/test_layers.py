"""The house's layering, read from the code: imports go one way and no module imports itself back.

Every import counts, function-local ones too, so none can dodge a cycle by moving into a function.
The layer order is the one docs/design.md ("Where each thing lives") describes.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("specdec", "kernels_pallas", "experiments", "configs")

# Lowest first; a module may import its own layer and the layers below it, never one above.
LAYERS = (
  ("specdec.quant", "specdec.metrics", "specdec.data", "specdec.xla_env", "specdec.progress"),
  ("specdec.sharding",),  # meshes and where params go: jax and the quantized weight types
  ("kernels_pallas",),
  ("specdec.ops",),
  ("specdec.models", "specdec.model"),
  ("specdec.checkpoint",),
  ("specdec.drafters",),
  ("specdec.decoding",),
  ("specdec.training",),
  ("specdec",),  # the curated API
  ("specdec.lab",),
  ("specdec.bench",),
  ("experiments", "configs"),
)


def _module_of(path: Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
  return {_module_of(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _targets(node: ast.AST, modules) -> list[str]:
  """The project modules one import statement loads (a `from pkg import sub` loads pkg.sub)."""
  if isinstance(node, ast.Import):
    names = [a.name for a in node.names]
  elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
    names = [
      f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
      for a in node.names
    ]
  else:
    return []
  return sorted({n for n in names if n in modules})


def import_graph() -> dict[str, set[str]]:
  modules = _modules()
  graph = {}
  for name, path in modules.items():
    tree = ast.parse(path.read_text(), str(path))
    graph[name] = {t for node in ast.walk(tree) for t in _targets(node, modules)} - {name}
  return graph


def layer_of(module: str) -> int:
  best = max(
    (
      (len(prefix), i)
      for i, layer in enumerate(LAYERS)
      for prefix in layer
      if module == prefix or module.startswith(prefix + ".")
    ),
    default=None,
  )
  if best is None:
    raise AssertionError(f"{module} is in no layer of tests/test_layers.py")
  return best[1]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_no_import_cycle_between_project_modules():
  assert cycles(import_graph()) == []


def test_imports_go_down_the_layers_only():
  upward = [
    f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
    for a, targets in sorted(import_graph().items())
    for b in sorted(targets)
    if layer_of(b) > layer_of(a)
  ]
  assert upward == []


def test_the_checker_sees_cycles_and_upward_imports():
  # Negative controls: a two-module cycle and an upward import must both be caught.
  assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
  assert layer_of("specdec.quant.nvfp4") < layer_of("kernels_pallas.nvfp4_gemv")
  assert layer_of("specdec.lab.sweep") > layer_of("specdec.decoding.step")


@pytest.mark.parametrize("package", ["specdec", "kernels_pallas"])
def test_every_module_is_in_a_layer(package):
  for name in _modules():
    if name.split(".")[0] == package:
      layer_of(name)


def test_specdec_keeps_only_a_handful_of_loose_modules():
  loose = sorted(p.name for p in (ROOT / "specdec").glob("*.py"))
  assert loose == [
    "__init__.py", "metrics.py", "model.py", "progress.py", "sharding.py", "xla_env.py"
  ]  # fmt: skip


def _flag_mains() -> set[str]:
  """experiments modules that define absl flags at import (a main owns its flags)."""
  out = set()
  for name, path in _modules().items():
    tree = ast.parse(path.read_text(), str(path))
    calls = [n.value for n in tree.body if isinstance(n, ast.Assign | ast.Expr)]
    if any(
      isinstance(c, ast.Call)
      and isinstance(c.func, ast.Attribute)
      and c.func.attr.startswith("DEFINE")
      for c in calls
    ):
      out.add(name)
  return out


def _loaded_by(sources, graph, modules) -> set[str]:
  """Project modules the given files import, directly or through the modules they load."""
  todo = {
    t
    for p in sources
    for node in ast.walk(ast.parse(p.read_text()))
    for t in _targets(node, modules)
  }
  seen = set()
  while todo:
    m = todo.pop()
    if m not in seen:
      seen.add(m)
      todo |= graph.get(m, set())
  return seen


def test_tests_load_at_most_one_main_with_flags_in_process():
  # A pytest worker imports every test file, so two mains defining the same flag (--out) in it
  # raise DuplicateFlagError; run the others as processes (python -m experiments.X).
  graph, modules = import_graph(), _modules()
  loaded = _loaded_by(sorted((ROOT / "tests").rglob("*.py")), graph, modules) & _flag_mains()
  assert len(loaded) <= 1, sorted(loaded)


def test_the_flag_check_sees_mains():
  assert {"experiments.sweep", "experiments.export_quant_zoo"} <= _flag_mains()
  assert not {"experiments", "configs.trees"} & _flag_mains()
