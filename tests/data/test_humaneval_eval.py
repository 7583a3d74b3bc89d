from specdec.data.humaneval_eval import parse_rate, parses, truncate_completion

PROMPT = 'def add(a, b):\n    """Add."""\n'


def test_truncates_at_the_next_top_level_statement():
  c = "    return a + b\n\n\ndef other():\n    pass\n"
  assert truncate_completion(c) == "    return a + b\n\n"


def test_parse_checks():
  assert parses(PROMPT, "    return a + b\nprint(add(1, 2))")
  assert not parses(PROMPT, "    return a +\n")
  assert not parses("def f(x):\n", "")  # no body at all
  assert parse_rate([PROMPT, PROMPT], ["    return a\n", "    return (\n"]) == 0.5
