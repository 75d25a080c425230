#!/usr/bin/env bash
# Installs lockstep's build dependencies from Debian packages (Debian 12 "bookworm").
# As root it runs apt-get; otherwise it prints the exact command to run and fails.
# Nothing is downloaded at build time: CMake only finds what this installs.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config clang-format python3
  libeigen3-dev libhdf5-dev hdf5-tools libcli11-dev libspdlog-dev libfmt-dev
  nlohmann-json3-dev libtomlplusplus-dev libgtest-dev libgmock-dev libbenchmark-dev libssl-dev zlib1g-dev
  libicu-dev
  libcpp-httplib-dev
)
# Optional: installed when possible, never a reason to fail (features that need them say so and
# their tests skip): the LZ4 HDF5 filter plugin behind `--export-compress lz4`, and Chromium for
# the tests that check where a report's verdict lands on screen (headless screenshots), and
# Node.js + npm for the tokenizer tests against Hugging Face's tokenizers (tests/tokenizer/), and
# Slurm + munge for the test that runs a campaign on a real single-node Slurm (issue 41).
OPTIONAL=(hdf5-filter-plugin chromium slurm-wlm munge)
# npm may come with another nodejs build (NodeSource's bundles it): only asked for when absent.
command -v npm >/dev/null 2>&1 || OPTIONAL+=(nodejs npm)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in "${OPTIONAL[@]}"; do
  installed "$p" && continue
  if [ "$(id -u)" -eq 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$p" >&2 ||
      echo "lockstep: optional package $p could not be installed (its features stay off)" >&2
  else
    case "$p" in
      chromium) why="runs the report screenshot tests" ;;
      nodejs | npm) why="runs the tokenizer comparison with Hugging Face's tokenizers" ;;
      slurm-wlm | munge) why="runs the --executor slurm test on a single-node Slurm" ;;
      *) why="enables --export-compress lz4" ;;
    esac
    echo "lockstep: optional package $p is not installed (apt install $p $why)" >&2
  fi
done

missing=()
for p in "${PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
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
