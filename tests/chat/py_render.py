#!/usr/bin/env python3
"""Python Jinja's rendering of each conversation, in transformers' environment (sandboxed,
trim_blocks and lstrip_blocks, its tojson): the semantics Qwen's template was written for.

  py_render.py TOKENIZER_CONFIG_JSON CONVERSATIONS_JSONL OUT_JSONL
"""
import json
import sys

from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                    sort_keys=sort_keys)


def main():
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
  env.filters["tojson"] = tojson
  cfg = json.load(open(sys.argv[1], encoding="utf-8"))
  template = env.from_string(cfg["chat_template"])
  special = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")
             if isinstance(cfg.get(k), str)}
  with open(sys.argv[3], "w", encoding="utf-8") as out:
    for line in open(sys.argv[2], encoding="utf-8"):
      c = json.loads(line)
      v = dict(special, messages=c["messages"], add_generation_prompt=c["add_generation_prompt"])
      for k in ("enable_thinking", "tools"):
        if k in c:
          v[k] = c[k]
      try:
        out.write(json.dumps({"text": template.render(**v)}, ensure_ascii=False) + "\n")
      except Exception as e:  # noqa: BLE001 - the error is the result
        out.write(json.dumps({"error": str(e)}) + "\n")


if __name__ == "__main__":
  main()
