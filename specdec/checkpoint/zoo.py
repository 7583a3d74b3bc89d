"""Names of the models shipped in specdec/zoo."""

import os

ZOO_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "zoo")


def resolve_path(spec: str) -> str:
  """'zoo:<name>' names a model shipped in specdec/zoo; anything else is a path."""
  if spec.startswith("zoo:"):
    return os.path.join(ZOO_DIR, spec[4:])
  return spec
