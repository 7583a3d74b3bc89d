"""Syntax check of HumanEval completions: the share of prompt + completion that `ast.parse` accepts.

A raw completion runs on past the function; it is cut at the first line that starts at column 0
(a new top-level statement: def, class, if, print, a comment, ...), HumanEval's usual stop rule.
"""

import ast


def truncate_completion(completion: str) -> str:
  lines = completion.split("\n")
  for i, line in enumerate(lines[1:], start=1):
    if line and not line[0].isspace():
      return "\n".join(lines[:i])
  return completion


def parses(prompt: str, completion: str) -> bool:
  try:
    ast.parse(prompt + truncate_completion(completion))
  except (SyntaxError, ValueError):
    return False
  return True


def parse_rate(prompts: list[str], completions: list[str]) -> float:
  ok = [parses(p, c) for p, c in zip(prompts, completions, strict=True)]
  return sum(ok) / len(ok)
