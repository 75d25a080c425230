#!/usr/bin/env bash
# The openai_client CTest fixture: the official OpenAI Node client (npm `openai`, pinned) in
# OUT/npm with npm's cache in OUT/npm-cache (nothing outside the build folder).
#   setup_openai.sh OUT
# Where the registry cannot be reached (or node / npm are not installed) it writes OUT/skip.txt
# with the reason and exits 0: the tests then skip with that message.
set -euo pipefail
out=$1
mkdir -p "$out"
rm -f "$out/skip.txt"
skip() {
  echo "$1" >"$out/skip.txt"
  echo "openai_client: skipped: $1"
  exit 0
}
command -v node >/dev/null && command -v npm >/dev/null || skip "node and npm are not installed (apt install nodejs npm)"
export npm_config_cache="$out/npm-cache" npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
pkgs=(openai@6.49.0)
if [ ! -f "$out/npm/.installed" ] || [ "$(cat "$out/npm/.installed")" != "${pkgs[*]}" ]; then
  timeout 60 npm view openai@6.49.0 version >/dev/null 2>"$out/npm-view.log" ||
    skip "the npm registry cannot be reached ($(tail -1 "$out/npm-view.log"))"
  mkdir -p "$out/npm"
  timeout 300 npm install --prefix "$out/npm" --no-save --no-package-lock "${pkgs[@]}" >"$out/npm-install.log" 2>&1 ||
    { tail -20 "$out/npm-install.log"; exit 1; }
  echo "${pkgs[*]}" >"$out/npm/.installed"
fi
echo "openai_client: ${pkgs[*]} installed"
