#!/usr/bin/env bash
# Installs lockstep's build dependencies from Debian packages (Debian 12 "bookworm").
# As root it runs apt-get; otherwise it prints the exact command to run and fails.
# Nothing is downloaded at build time: CMake only finds what this installs.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libeigen3-dev libhdf5-dev hdf5-tools libcli11-dev libspdlog-dev libfmt-dev
  nlohmann-json3-dev libtomlplusplus-dev libgtest-dev libgmock-dev libbenchmark-dev libssl-dev zlib1g-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "lockstep: missing packages: ${missing[*]}" >&2
  echo "run as root:  $cmd" >&2
  exit 1
fi
echo "lockstep: installing ${missing[*]}" >&2
bash -c "$cmd" >&2
