#!/usr/bin/env python3
"""Seeded conversations for the chat-template parity test (tests/chat/README.md).

  gen_conversations.py OUT.jsonl [COUNT]

One JSON object a line: messages, add_generation_prompt, optionally enable_thinking and tools,
and "set": "main" (compared byte for byte with @huggingface/jinja) or "strip" (assistant text with
spaces or tabs where Qwen3's template calls strip('\\n') / lstrip('\\n'): @huggingface/jinja
ignores the argument and strips all whitespace, Python's Jinja strips newlines only; the test
checks those against Python semantics and that they differ from @huggingface/jinja only in
whitespace). The same seed gives the same file.
"""
import json
import random
import sys

SEED = 42
WORDS = ["hello", "world", "the", "model", "token", "cache", "slot", "why", "is", "it", "so",
         "deterministic", "A/A", "diff", "kernel", "GPU", "batch", "invariant", "?", "!", "42"]
SCRIPTS = ["你好，世界", "日本語のテキスト", "مرحبا بالعالم", "नमस्ते दुनिया", "Ünïcödé façade",
           "e\u0301 a\u0308 n\u0303", "👩‍👩‍👧‍👦 🏳️‍🌈 👍🏽 1️⃣", "한국어 한", "Ελληνικά", "ℝ ∑ ∫ ≠ ≤"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
           "{{ not_a_var }}", "{% if %}", "{# c #}", "\\n", "'quoted'", "\"dq\""]
CODE = ["def f(x):\n    return x + 1\n", "int main() {\n\treturn 0;\n}", "SELECT * FROM t;",
        "{\"k\": [1, 2, {\"x\": null}]}", "if a < b && c > d { }", "  indented\n    more\n"]
WS = ["\n", "\n\n", " ", "\t", "  ", "\r\n", "\u00a0", "\u3000"]


def words(r, n):
  return " ".join(r.choice(WORDS) for _ in range(n))


def text(r, allow_empty=True):
  k = r.random()
  if allow_empty and k < 0.06:
    return ""
  if k < 0.10:
    return "x" * r.randint(2000, 9000) + words(r, 5)  # long
  parts = []
  for _ in range(r.randint(1, 6)):
    c = r.random()
    if c < 0.4:
      parts.append(words(r, r.randint(1, 12)))
    elif c < 0.6:
      parts.append(r.choice(SCRIPTS))
    elif c < 0.72:
      parts.append(r.choice(SPECIAL))
    elif c < 0.84:
      parts.append(r.choice(CODE))
    else:
      parts.append(r.choice(WS))
  return "".join(r.choice(["", " ", "\n"]) + p for p in parts)


def tidy(s):
  """No whitespace at either end: where @huggingface/jinja's strip differs from Python's."""
  return s.strip() or "ok"


def tool_call(r):
  args = {"city": r.choice(SCRIPTS), "days": r.randint(0, 30), "units": r.choice(["c", "f"]),
          "flags": [True, False, None], "nested": {"a": [1, 2], "b": {"c": "d"}}}
  fn = {"name": r.choice(["get_weather", "search", "run_code"]),
        "arguments": args if r.random() < 0.6 else json.dumps(args, ensure_ascii=False)}
  return {"type": "function", "function": fn} if r.random() < 0.8 else fn


def assistant(r, strip_set):
  m = {"role": "assistant"}
  think = r.random()
  # No think tags of its own and no whitespace where the template strips (the "main" set).
  plain = lambda: text(r).replace("<think>", "<th>").replace("</think>", "</th>")  # noqa: E731
  answer = plain().lstrip()
  reasoning = tidy(plain())
  if strip_set:
    pad = lambda: r.choice([" ", "\t", "  \n", " \n\t"])  # noqa: E731
    reasoning = pad() + reasoning + pad()
    answer = pad() + answer
  if think < 0.35:
    m["content"] = ("<think>" + r.choice(["", "\n", "\n\n"]) + reasoning + r.choice(["", "\n"]) +
                    "</think>" + r.choice(["", "\n", "\n\n"]) + answer)
  elif think < 0.5:
    m["content"] = answer
    m["reasoning_content"] = reasoning
  else:
    m["content"] = answer
  if r.random() < 0.2:
    m["tool_calls"] = [tool_call(r) for _ in range(r.randint(1, 3))]
  return m


def conversation(r, strip_set):
  msgs = []
  if r.random() < 0.5:
    msgs.append({"role": "system", "content": text(r)})
  turns = r.randint(1, 5)
  roles = []
  for t in range(turns):
    roles.append("user")
    if r.random() < 0.15:
      roles += ["assistant", "tool"] + (["tool"] if r.random() < 0.5 else [])
    if t < turns - 1 or r.random() < 0.4:
      roles.append("assistant")
  if r.random() < 0.1:
    roles.insert(r.randrange(1, len(roles) + 1), "system")  # a system message not first
  for i, role in enumerate(roles):
    if role == "assistant":
      msgs.append(assistant(r, strip_set))
    elif role == "tool":
      msgs.append({"role": "tool", "content": text(r)})
    elif role == "user" and r.random() < 0.1:
      msgs.append({"role": "user", "content": "<tool_response>" + text(r) + "</tool_response>"})
    else:
      msgs.append({"role": role, "content": text(r)})
  c = {"messages": msgs, "add_generation_prompt": r.random() < 0.7,
       "set": "strip" if strip_set else "main"}
  e = r.random()
  if e < 0.33:
    c["enable_thinking"] = False
  elif e < 0.66:
    c["enable_thinking"] = True
  if r.random() < 0.15:
    c["tools"] = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city " + r.choice(SCRIPTS),
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
  return c


def main():
  out, count = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 300
  r = random.Random(SEED)
  with open(out, "w", encoding="utf-8") as f:
    for i in range(count):
      f.write(json.dumps(conversation(r, strip_set=i % 10 == 9), ensure_ascii=False) + "\n")


if __name__ == "__main__":
  main()
