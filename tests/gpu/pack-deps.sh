#!/usr/bin/env bash
# tests/gpu/pack-deps.sh — run HERE (a Debian 12 development machine) before a device call.
#
# The lent GPU machine has nvcc, CMake and the CUDA libraries but none of our Debian -dev
# packages, and it cannot download anything. This fetches the .deb files of the build
# dependencies (scripts/install-deps.sh's list and their library closure, without the C/C++
# runtime every machine has) into .gpu-deps/ (git-ignored, ~40 MiB). Name `.gpu-deps` in the
# device call's `carry`; tests/gpu/check.sh unpacks them into a private prefix there.
set -euo pipefail
cd "$(dirname "$0")/../.."
PKGS="libeigen3-dev libhdf5-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev libbenchmark-dev libssl-dev zlib1g-dev pkgconf"
# Present on any Linux the binaries run on (and unsafe to unpack over another distribution's).
BASE='^(libc6|libc6-dev|libc-dev-bin|gcc-12-base|libgcc-s1|libstdc\+\+6|linux-libc-dev|libcrypt1|libcrypt-dev|catch2|libnsl-dev|libnsl2|libtirpc.*|rpcsvc-proto|libjpeg.*|libgfortran5|libquadmath0|libhdf5-.*fortran.*)$'
mkdir -p .gpu-deps && cd .gpu-deps
# shellcheck disable=SC2086
list=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
         --no-enhances --no-pre-depends $PKGS | grep -v '^ ' | grep -v '^<' | sort -u | grep -Ev "$BASE")
# shellcheck disable=SC2086
apt-get download $list >/dev/null
du -sh . | sed 's/^/.gpu-deps: /'
