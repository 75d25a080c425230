#!/usr/bin/env bash
# Installs the optional llama.cpp component (issue 38) into a cache folder:
#   default <repo>/.cache/llamacpp (git-ignored); env: LOCKSTEP_LLAMACPP_DIR overrides it.
#
# Fetches two pinned npm packages as tarballs (`npm pack`, no dependency tree), checks each
# against the sha512 integrity recorded below (from `npm view PKG@VERSION dist.integrity`), and
# unpacks:
#   lib/       the prebuilt CPU shared libraries of @node-llama-cpp/linux-x64 (libllama, libggml,
#              libggml-base and the libggml-cpu-<variant>.so set the CPU backend picks from at run
#              time through ggml_backend_load_all_from_path)
#   include/   llama.h and ggml/include/*.h from node-llama-cpp's llama/gitRelease.bundle (the
#              llama.cpp source the libraries were built from)
#   src/       a checkout of that bundle limited to the headers, src/models/qwen3next.cpp, the
#              converter (convert_hf_to_gguf.py, gguf-py)
#   commit     the bundle's commit id (lockstep --version and every llama.cpp export name it)
# The build compiles its adapter against include/ (cmake -DLOCKSTEP_LLAMACPP, default on when
# include/llama.h is here) and the adapter loads lib/ at run time.
#
# Idempotent: a second run with everything in place prints one line and downloads nothing.
# Exit 0 installed (or already), 1 failed (no network, wrong checksum, missing tool): `make test`
# runs it non-fatally, and without the component the llama.cpp tests skip with the reason.
set -euo pipefail

VERSION=3.22.1
PKG_SRC=node-llama-cpp
PKG_BIN=@node-llama-cpp/linux-x64
# npm view node-llama-cpp@3.22.1 dist.integrity
INTEGRITY_SRC='sha512-bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw=='
# npm view @node-llama-cpp/linux-x64@3.22.1 dist.integrity
INTEGRITY_BIN='sha512-5uCCDNqWCNfaAm8aR/Uzxbo4HBpKgNF91kCHPepKhgMgV2OAmatoefbOlMihsqCiH2Od35E/eUHQCFbfRBJuOg=='

repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${LOCKSTEP_LLAMACPP_DIR:-$repo/.cache/llamacpp}  # env: LOCKSTEP_LLAMACPP_DIR
stamp="$dir/installed"
want="node-llama-cpp $VERSION $INTEGRITY_SRC $INTEGRITY_BIN"

fail() {
  echo "install-llamacpp: $*" >&2
  exit 1
}

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -f "$dir/include/llama.h" &&
  -f "$dir/lib/libllama.so" && -s "$dir/commit" ]]; then
  echo "install-llamacpp: already installed in $dir (llama.cpp $(cat "$dir/commit"))"
  exit 0
fi

for tool in npm tar git openssl base64; do
  command -v "$tool" >/dev/null 2>&1 || fail "'$tool' is not installed (Debian: apt-get install nodejs npm git openssl)"
done

rm -f "$stamp"
mkdir -p "$dir"
work=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT

# sha512 integrity of a file in npm's form ("sha512-" + base64 of the raw digest).
integrity() { echo "sha512-$(openssl dgst -sha512 -binary "$1" | base64 -w0)"; }

fetch() {  # PACKAGE INTEGRITY -> path of the verified tarball
  local pkg=$1 want_sum=$2 name got
  name=$(cd "$work" && npm pack --silent "$pkg@$VERSION" 2>"$work/npm.log" | tail -1) ||
    fail "npm pack $pkg@$VERSION failed: $(tail -3 "$work/npm.log")"
  [[ -f "$work/$name" ]] || fail "npm pack $pkg@$VERSION wrote no tarball"
  got=$(integrity "$work/$name")
  [[ "$got" == "$want_sum" ]] || fail "$pkg@$VERSION: integrity $got, expected $want_sum"
  echo "$work/$name"
}

echo "install-llamacpp: fetching $PKG_BIN@$VERSION and $PKG_SRC@$VERSION into $dir"
tgz_bin=$(fetch "$PKG_BIN" "$INTEGRITY_BIN")
tgz_src=$(fetch "$PKG_SRC" "$INTEGRITY_SRC")

# The prebuilt libraries (CPU variants; no CUDA or Vulkan in this package).
mkdir -p "$work/bin" "$work/src-pkg"
tar -xzf "$tgz_bin" -C "$work/bin" --wildcards 'package/bins/linux-x64/*.so'
rm -rf "$dir/lib"
mkdir -p "$dir/lib"
cp "$work/bin/package/bins/linux-x64/"*.so "$dir/lib/"
# Stable names for the adapter: the package's files carry the version in their names.
ln -sf libllama.v0.5.0.so "$dir/lib/libllama.so"
ln -sf libggml.v0.5.0.so "$dir/lib/libggml.so"
[[ -f "$dir/lib/libllama.v0.5.0.so" && -f "$dir/lib/libggml-base.so" ]] ||
  fail "$PKG_BIN@$VERSION: libllama / libggml-base not found in bins/linux-x64"

# The matching source: headers (and the converter) from the git bundle.
tar -xzf "$tgz_src" -C "$work/src-pkg" package/llama/gitRelease.bundle
rm -rf "$dir/src"
git clone -q --no-checkout "$work/src-pkg/package/llama/gitRelease.bundle" "$dir/src" ||
  fail "git clone of $PKG_SRC's llama/gitRelease.bundle failed"
git -C "$dir/src" checkout -q HEAD -- include ggml/include src/models/qwen3next.cpp \
  convert_hf_to_gguf.py conversion gguf-py ||
  fail "the bundle lacks include/ or ggml/include/"
rm -rf "$dir/include"
mkdir -p "$dir/include"
cp "$dir/src/include/"*.h "$dir/src/ggml/include/"*.h "$dir/include/"
git -C "$dir/src" rev-parse HEAD >"$dir/commit"

echo "$want" >"$stamp"
echo "install-llamacpp: installed llama.cpp $(cat "$dir/commit") in $dir"
