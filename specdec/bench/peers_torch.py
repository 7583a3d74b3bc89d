"""The transformers side of `experiments/bench_peers.py`: a worker process that builds or loads HF
models and times their `generate`, driven op by op over stdin/stdout by `specdec.bench.peers`.

It runs as a script (`python specdec/bench/peers_torch.py`) under any Python that has torch and
transformers, and imports nothing from specdec or JAX, which that Python may lack; a process of
its own keeps the two frameworks' GPU allocators apart. torch is imported inside the ops, so
specdec.bench.peers can import this module for the weight rule below (the one definition both
sides use) in an environment without torch.

Protocol: one JSON object per line each way. A request is {"op": NAME, **arguments}; the reply is
{"ok": result} or {"error": traceback}. Everything else the libraries print goes to stderr.

Same weights without moving them: every 2-D tensor is a counter-based hash of (seed, HF tensor
name, flat index in HF layout) mapped to (byte - 128) * 2**-exp, which bf16 represents exactly;
1-D tensors (the RMSNorm scales) are ones, as HF initialises them. Both frameworks compute it on
their own device in milliseconds, so a 16 GB model never crosses the disk or the host, and
`_fingerprint` (an exact integer checksum per tensor) proves the two sides hold the same values.
"""

import json
import math
import os
import sys
import time
import traceback
import zlib

# Odd multipliers below 2**31: torch has no wrapping uint32 multiply, so it computes in int64 and
# masks, and x < 2**32 times one of these cannot overflow int64.
_HASH_MUL = (0x2C1B3C6D, 0x297A2D39, 0x7FEB352D)
_MASK32 = 0xFFFFFFFF
ARMS = ("greedy", "static", "assisted", "prompt_lookup")


def tensor_seed(name: str, seed: int) -> int:
  """The hash key of one tensor: a uint32 from the run's seed and the tensor's HF name."""
  return zlib.crc32(f"{seed}/{name}".encode())


def hashed_bytes(idx, key, wrap):
  """Pseudo-random ints in [0, 256) for flat indices `idx` (non-negative, < 2**32).

  Works on numpy / jax.numpy uint32 arrays (`wrap` = identity: their arithmetic wraps mod 2**32)
  and on torch int64 tensors (`wrap` = masking to the low 32 bits); the results are identical.
  """
  x = wrap(wrap(idx * _HASH_MUL[0]) + key)
  x = wrap((x ^ (x >> 16)) * _HASH_MUL[1])
  x = wrap((x ^ (x >> 15)) * _HASH_MUL[2])
  return (x ^ (x >> 16)) >> 24


def _hashed_tensor(torch, name, shape, seed, exp, dtype, device):
  if len(shape) == 1:
    return torch.ones(shape, dtype=dtype, device=device)
  idx = torch.arange(math.prod(shape), dtype=torch.int64, device=device)
  b = hashed_bytes(idx, tensor_seed(name, seed), lambda v: v & _MASK32)
  return ((b.to(torch.float32) - 128.0) * 2.0**-exp).to(dtype).reshape(shape)


def _fingerprint(torch, p, exp) -> int:
  """sum(value * 2**exp) mod 2**32: exact, since every value is an integer multiple of 2**-exp."""
  return int((p.float() * 2.0**exp).round().to(torch.int64).sum().item()) % 2**32


class Worker:
  def __init__(self):
    self.models = {}
    self.torch = self.device = None

  def op_hello(self, device: str = "auto") -> dict:
    import torch
    import transformers

    self.torch = torch
    if device == "auto":
      device = "cuda" if torch.cuda.is_available() else "cpu"
    self.device = torch.device(device)
    name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
    return {
      "torch": torch.__version__,
      "transformers": transformers.__version__,
      "python": sys.version.split()[0],
      "device": name,
    }

  def _dtype(self, dtype: str):
    return {"bfloat16": self.torch.bfloat16, "float32": self.torch.float32}[dtype]

  def op_build_random(self, name: str, config: dict, seed: int, exp: int, dtype: str) -> dict:
    """An HF model of `config` holding the hashed weights; returns their fingerprints."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch = self.torch
    cfg = dict(config)
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device(self.device):
      model = AutoModelForCausalLM.from_config(hf_config, dtype=self._dtype(dtype)).eval()
    fingerprints = {}
    with torch.no_grad():
      for pname, p in model.named_parameters():
        p.copy_(_hashed_tensor(torch, pname, tuple(p.shape), seed, exp, p.dtype, self.device))
        fingerprints[pname] = _fingerprint(torch, p, exp)
    self.models[name] = model
    if self.device.type == "cuda":
      torch.cuda.empty_cache()  # the hash's int64 temporaries: leave that memory to JAX's process
    return fingerprints

  def op_load(self, name: str, path: str, dtype: str) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=self._dtype(dtype))
    self.models[name] = model.to(self.device).eval()
    return {"parameters": sum(p.numel() for p in model.parameters())}

  def op_generate(
    self,
    arm: str,
    prompts: list,
    max_new_tokens: int,
    target: str = "target",
    draft: str | None = None,
    k: int | None = None,
    max_ngram: int | None = None,
  ) -> dict:
    """Greedy `generate` once per prompt (B = 1): per request its host times and tokens.

    arm: greedy (dynamic cache, eager), static (`cache_implementation="static"`, which
    transformers compiles on a GPU), assisted (`assistant_model`, a fixed k: constant schedule,
    no confidence stop), prompt_lookup (`prompt_lookup_num_tokens`).
    """
    from transformers.generation.streamers import BaseStreamer

    torch = self.torch
    if arm not in ARMS:
      raise ValueError(f"unknown arm {arm!r}; choose from {ARMS}")
    model = self.models[target]

    class Clock(BaseStreamer):
      """Stamps every `put`: the first is the prompt, the second the first new token(s)."""

      def __init__(self):
        self.times = []

      def put(self, value):
        self.times.append(time.perf_counter())

      def end(self):
        pass

    kw = {"max_new_tokens": max_new_tokens, "do_sample": False}
    if arm == "static":
      kw["cache_implementation"] = "static"
    elif arm == "assisted":
      assistant = self.models[draft]
      gc = assistant.generation_config  # the candidate generator reads the assistant's config
      gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = k, "constant"
      gc.assistant_confidence_threshold = 0.0  # 0 = off; the default 0.4 would cut drafts short
      kw["assistant_model"] = assistant
    elif arm == "prompt_lookup":
      kw.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=max_ngram)
    eos = model.generation_config.eos_token_id
    kw["pad_token_id"] = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    forwards = [0]
    # Counting target forwards gives HF's tokens per forward. A hook inside the compiled forward
    # of the static arm could break its graph, and that arm does one forward per token anyway.
    hook = None
    if arm != "static":
      hook = model.register_forward_pre_hook(lambda m, a: forwards.__setitem__(0, forwards[0] + 1))
    out = []
    try:
      for ids in prompts:
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        clock = Clock()
        forwards[0] = 0
        self._sync()
        start = time.perf_counter()
        seq = model.generate(x, attention_mask=torch.ones_like(x), streamer=clock, **kw)
        tokens = seq[0, len(ids) :].tolist()  # copies to the host, so the work is done
        end = time.perf_counter()
        first = clock.times[1] if len(clock.times) > 1 else end
        out.append(
          {
            "start_s": start,
            "first_token_s": first,
            "end_s": end,
            "tokens": tokens,
            "target_forwards": forwards[0] if hook is not None else None,
          }
        )
    finally:
      if hook is not None:
        hook.remove()
    # Whether transformers compiled the forward: it caches the compiled call there.
    return {"requests": out, "compiled": hasattr(model, "_compiled_call")}

  def _sync(self):
    if self.device.type == "cuda":
      self.torch.cuda.synchronize(self.device)


def main() -> None:
  proto = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)  # library prints (compile logs, warnings) must not land in the protocol stream
  sys.stdout = sys.stderr
  worker = Worker()
  for line in sys.stdin:
    request = json.loads(line)
    op = request.pop("op")
    try:
      fn = getattr(worker, f"op_{op}", None)
      if fn is None:
        raise ValueError(f"unknown op {op!r}")
      reply = {"ok": fn(**request)}
    except Exception:  # any failure goes back to the driver, which raises it with this text
      reply = {"error": traceback.format_exc()}
    proto.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
  main()
