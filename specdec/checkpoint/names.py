"""The one table between HF tensor names and our params pytree paths.

Each row: (HF name regex, params path template, transpose). Linear weights are stored (out, in) by
HF and (in, out) by us, hence the transpose flag. The loader and the writer both use this table.
"""

import re

NAME_TABLE: tuple[tuple[str, str, bool], ...] = (
  (r"model\.embed_tokens\.weight", "embed/embedding", False),
  (r"model\.norm\.weight", "final_norm/scale", False),
  (r"lm_head\.weight", "lm_head/kernel", True),
  (r"model\.layers\.(\d+)\.input_layernorm\.weight", "layer_{0}/attn_norm/scale", False),
  (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", "layer_{0}/mlp_norm/scale", False),
  (
    r"model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.weight",
    "layer_{0}/attn/{1}_proj/kernel",
    True,
  ),
  (r"model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.bias", "layer_{0}/attn/{1}_proj/bias", False),
  (r"model\.layers\.(\d+)\.self_attn\.([qk])_norm\.weight", "layer_{0}/attn/{1}_norm/scale", False),
  (
    r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight",
    "layer_{0}/mlp/{1}_proj/kernel",
    True,
  ),
  (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.bias", "layer_{0}/mlp/{1}_proj/bias", False),
)
# Present in some checkpoints, carrying nothing the target needs: rotary buffers, and the MTP head
# Qwen3-Next / Qwen3.5 checkpoints ship beside the target (specdec.drafters.load_mtp reads it).
IGNORED = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"mtp\..+")

_COMPILED = tuple((re.compile(p + r"\Z"), t, tr) for p, t, tr in NAME_TABLE)

# Where the language model's tensors sit: `model.` in a text checkpoint; `model.language_model.` in
# a vision-language wrapper (Qwen3.5 as published), beside `lm_head.*` and `mtp.*` at the top and
# the vision tower under `model.visual.`, which a text-only target does not read.
TEXT_PREFIX = "model."
WRAPPER_PREFIX = "model.language_model."
VISION_PREFIX = "model.visual."


def to_path(hf_name: str) -> tuple[str, bool] | None:
  """HF name -> (params path 'a/b/c', transpose) or None if the table has no row for it."""
  for regex, template, transpose in _COMPILED:
    m = regex.match(hf_name)
    if m:
      return template.format(*m.groups()), transpose
  return None


def to_hf_name(path: str, table=NAME_TABLE) -> tuple[str, bool]:
  """params path -> (HF name, transpose): the writer's direction of the same table (or of
  another table of rows in its form)."""
  for pattern, template, transpose in table:
    groups = re.findall(r"\(([^)]*)\)", pattern)
    regex = re.escape(template)
    for i, g in enumerate(groups):
      regex = regex.replace(re.escape("{" + str(i) + "}"), f"({g})")
    m = re.match(regex + r"\Z", path)
    if m:
      name = pattern
      for value in m.groups():
        name = re.sub(r"\([^)]*\)", value, name, count=1)
      return name.replace("\\.", "."), transpose
  raise KeyError(f"params path {path!r} has no HF name in its name table")


def text_name(name: str, prefix: str = TEXT_PREFIX) -> str | None:
  """A stored tensor name as a text checkpoint spells it, the language model's tensors sitting
  under `prefix`; None for another name under `model.` (in a wrapper: not the language model's)."""
  if prefix == TEXT_PREFIX or not name.startswith(TEXT_PREFIX):
    return name
  if name.startswith(prefix):
    return TEXT_PREFIX + name[len(prefix) :]
  return None


def stored_name(name: str, prefix: str = TEXT_PREFIX) -> str:
  """The inverse of `text_name`: a text checkpoint's name as one with `prefix` stores it."""
  return prefix + name[len(TEXT_PREFIX) :] if name.startswith(TEXT_PREFIX) else name


def is_ignored(hf_name: str) -> bool:
  return any(re.match(p + r"\Z", hf_name) for p in IGNORED)


def module_of(path: str) -> str:
  """params path of a Linear kernel -> its HF module name (the key quantization configs use)."""
  name, _ = to_hf_name(path)
  return name.rsplit(".", 1)[0]
