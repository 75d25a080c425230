#!/usr/bin/env bash
# tests/gpu/check.sh [OUT_DIR] — the one GPU check of the CUDA backend (run on a lent GPU).
#
#   1. configure + build with CUDA (sm_80 + sm_90) in build-gpu/
#   2. GPU unit tests: every kernel against the CPU op (CudaOps.*), the engine against the CPU
#      reference, deterministic A/A, batch invariance, multi-GPU NCCL hand-off (CudaEngine.*)
#   3. cuda-vs-cpu through the product: `lockstep generate --export` on both backends, then
#      `lockstep diff` with the documented thresholds (state NRMSE 1e-4, logits KL 1e-6), for
#      `small` with f32 and with bf16 matrices, and on a ~760-token prompt (attention past its
#      context split)
#   4. the deterministic cuda A/A (bf16 `small`, diff at NRMSE 0; also against --cuda-graphs off)
#      and campaign (campaigns/aa-cuda.toml); --deterministic off must differ (the exact diff fails)
#   5. the GPU benchmarks (decode of seed48, small and wide vs the measured bandwidth bound;
#      verify T<=9 vs T=1; decode at 8k positions with and without the attention split; the GDN
#      recurrence and chunked prefill, each against its one-block-per-head form)
# On the lent machine: run tests/gpu/pack-deps.sh here first and name `.gpu-deps` in `carry`:
#   run(command="tests/gpu/check.sh", carry=[".gpu-deps"], timeout_s=540)
# Logs and summary.md go to OUT_DIR (default $OUT, else out/gpu-check). Budget: < 8 minutes on
# one H200 (the build is most of it). Exit status: 0 when every step passed.
#
# tests/gpu/check.sh --rehearse OUT_DIR: the same steps without a GPU, so that CI proves the
# script and every product command it drives before a lent GPU's minutes are spent on it (CTest
# `gpu_check_rehearsal`). `--backend cuda` runs on the CPU emulator's plugin
# (tests/cuda_emu: LOCKSTEP_PLUGIN_DIR, lazy streams), on `tiny` instead of `small` and with a
# shortened copy of campaigns/aa-cuda.toml; BUILD (default `build`) must already hold `lockstep`,
# the emulator plugin and cuda_emu_tests (nothing is configured or built). The unit-test step runs
# the emulator's CudaOps.* cases through the same skip rule, and the benchmark step must report
# the missing device as a failure (the check that a benchmark error fails the step).
#
# tests/gpu/check.sh --sanitize [OUT_DIR]: a second, optional run for a session with device time
# left after the check: builds as above (nothing to do on a warm machine), then runs CudaOps.*
# under compute-sanitizer's racecheck (shared-memory hazards inside a block: what the emulator,
# whose threads never run concurrently, cannot show) and synccheck (barriers in divergent code),
# each cut at SANITIZE_S seconds (default 120; a cut run reports what it found so far as TIMEOUT).
# Exit 2 when compute-sanitizer is not on the machine (COMPUTE_SANITIZER names another path).
# `--rehearse --sanitize OUT_DIR` runs the same steps on the emulator through
# tests/gpu/fake-compute-sanitizer.sh, on one CudaOps case (CTest `gpu_check_sanitize_rehearsal`).
set -uo pipefail
cd "$(dirname "$0")/../.."
REHEARSE=0
SANITIZE=0
if [ "${1:-}" = "--rehearse" ]; then REHEARSE=1; shift; fi
if [ "${1:-}" = "--sanitize" ]; then SANITIZE=1; shift; fi
OUT_DIR="${1:-${OUT:-out/gpu-check}}"
mkdir -p "$OUT_DIR"
if [ $REHEARSE = 1 ]; then BUILD="${BUILD:-build}"; else BUILD="${BUILD:-build-gpu}"; fi
JOBS="${JOBS:-$(nproc)}"
SUMMARY="$OUT_DIR/summary.md"
if [ $SANITIZE = 1 ]; then  # before any build time is spent
  SANITIZE_FILTER="${SANITIZE_FILTER:-CudaOps.*}"
  if [ $REHEARSE = 1 ]; then
    COMPUTE_SANITIZER="${COMPUTE_SANITIZER:-$PWD/tests/gpu/fake-compute-sanitizer.sh}"
    SANITIZE_FILTER=CudaOps.NormsMatchCpu
  fi
  SAN="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}"
  if [ -z "$SAN" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then SAN=/usr/local/cuda/bin/compute-sanitizer; fi
  if [ -z "$SAN" ] || ! [ -x "$SAN" ]; then
    echo "check.sh --sanitize: compute-sanitizer is not on this machine (${SAN:-PATH, /usr/local/cuda/bin})" >&2
    exit 2
  fi
fi
START=$(date +%s)
declare -a ROWS
status=0

# summary.md is rewritten after every step, so a run cut short by the time limit still leaves the
# table of the steps that finished (and their logs) under OUT_DIR.
write_summary() {
  {
    local mode=""
    if [ $SANITIZE = 1 ]; then mode=" --sanitize"; fi
    if [ $REHEARSE = 1 ]; then
      echo "# lockstep GPU check$mode: REHEARSAL on the CPU emulator (no GPU; preset $PRESET; not a measurement)"
    else
      echo "# lockstep GPU check$mode"
    fi
    echo
    echo "$(head -12 "$OUT_DIR/nvidia-smi.txt" | grep -m1 -E 'H200|H100|A100|NVIDIA' || echo 'GPU: see nvidia-smi.txt')"
    echo
    [ $SANITIZE = 1 ] || echo "cuda_tests: $(grep -c '^\[       OK \]' "$OUT_DIR/gpu_tests.log" 2>/dev/null) passed, \
$(grep -c '^\[  FAILED  \]' "$OUT_DIR/gpu_tests.log" 2>/dev/null) failed lines, \
$(grep -c '^\[  SKIPPED \]' "$OUT_DIR/gpu_tests.log" 2>/dev/null) skipped lines"
    echo
    echo "| step | result | time | log |"
    echo "|---|---|---|---|"
    for r in "${ROWS[@]}"; do echo "$r"; done
    if [ $SANITIZE = 1 ]; then
      echo
      grep -h "ERROR SUMMARY\|TIMEOUT" "$OUT_DIR/racecheck.log" "$OUT_DIR/synccheck.log" 2>/dev/null || true
      echo
      echo "Total: $(( $(date +%s) - START )) s"
      return
    fi
    echo
    echo "## Benchmarks"
    echo '```'
    grep -E "BM_|verify T=9|bandwidth|CUDA graphs|attention split|GDN " "$OUT_DIR/bench.log" 2>/dev/null || echo "(no benchmark output)"
    echo '```'
    echo
    echo "## --deterministic off against on"
    grep -E "^(PASS|FAIL|first failing)" "$OUT_DIR/nondet.log" 2>/dev/null || true
    echo
    echo "## cuda vs cpu"
    for d in f32 bf16 long; do
      if [ $d = long ]; then echo "bf16 weights, long context (attention past its split):"; else echo "$d weights:"; fi
      grep -E "^(thresholds|PASS|FAIL|First failing)" "$OUT_DIR/cuda_vs_cpu-$d.log" 2>/dev/null || true
    done
    echo
    echo "Total: $(( $(date +%s) - START )) s"
  } >"$SUMMARY"
}

step() {  # step NAME LOGFILE COMMAND...
  local name="$1" log="$2"; shift 2
  local t0=$(date +%s)
  echo "== $name" >&2
  if "$@" >"$OUT_DIR/$log" 2>&1; then r=PASS; else r=FAIL; status=1; fi
  ROWS+=("| $name | $r | $(( $(date +%s) - t0 )) s | $log |")
  echo "   $r ($(( $(date +%s) - t0 )) s)" >&2
  write_summary
}

nvidia-smi >"$OUT_DIR/nvidia-smi.txt" 2>&1 || echo "nvidia-smi not available" >>"$OUT_DIR/nvidia-smi.txt"

# The device image has nvcc and CMake but not our Debian -dev packages: tests/gpu/pack-deps.sh
# (run on the development machine) fetched them into .gpu-deps/, carried with the call; unpack
# them into a private prefix and point CMake, pkg-config and the loader at it.
if [ -d .gpu-deps ] && ! [ -f /usr/include/eigen3/Eigen/Core ]; then
  # Outside .gpu-deps (89 MiB unpacked: it would not fit a later call's 64 MiB carry), beside the
  # build folder, which the device machine keeps between calls.
  case "$BUILD" in /*) ROOT="$BUILD-deps" ;; *) ROOT="$PWD/$BUILD-deps" ;; esac
  if ! [ -d "$ROOT" ]; then
    mkdir -p "$ROOT"
    for d in .gpu-deps/*.deb; do
      if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$d" "$ROOT"
      else (t=$(mktemp -d) && cd "$t" && ar x "$OLDPWD/$d" && tar -xf data.tar.* -C "$ROOT" && rm -rf "$t"); fi
    done
  fi
  # Debian points hdf5.pc at the serial flavour through update-alternatives, which unpacking
  # does not run.
  pc="$ROOT/usr/lib/x86_64-linux-gnu/pkgconfig"
  [ -e "$pc/hdf5.pc" ] || ln -sf hdf5-serial.pc "$pc/hdf5.pc"
  export CMAKE_PREFIX_PATH="$ROOT/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_SYSROOT_DIR="$ROOT"
  export PKG_CONFIG_PATH="$ROOT/usr/lib/x86_64-linux-gnu/pkgconfig:$ROOT/usr/share/pkgconfig"
  export PKG_CONFIG="$ROOT/usr/bin/pkgconf"
  export LD_LIBRARY_PATH="$ROOT/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="$ROOT/usr/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$ROOT/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
  echo "dependencies from .gpu-deps unpacked into $ROOT" >"$OUT_DIR/deps.txt"
fi

PRESET=small
GPU_TESTS=("$BUILD/tests/cuda_tests" --gtest_brief=0)
if [ $REHEARSE = 1 ]; then
  PRESET=tiny
  GPU_TESTS=("$BUILD/tests/cuda_emu/cuda_emu_tests" --gtest_brief=0 "--gtest_filter=CudaOps.*")
  export LOCKSTEP_PLUGIN_DIR="$BUILD/tests/cuda_emu/plugin"  # env: read by the lockstep executable
  export EMU_ASYNC="${EMU_ASYNC:-1}"  # lazy streams: a missing wait shows up as wrong data
fi

build() {
  if [ $REHEARSE = 1 ]; then
    ls -l "$BUILD/harness/lockstep" "$LOCKSTEP_PLUGIN_DIR/liblockstep_cuda.so" "${GPU_TESTS[0]}" \
      "$BUILD/tests/bench/cuda_bench"
    return
  fi
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=ON -DLOCKSTEP_NATIVE=ON \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc ${PKG_CONFIG:+-DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG} &&
  cmake --build "$BUILD" -j"$JOBS" --target lockstep cuda_tests cuda_bench
}
if [ $REHEARSE = 1 ]; then
  step "build (rehearsal: the binaries already in $BUILD)" build.log build
else
  step "build (cuda, sm_80+sm_90)" build.log build
fi
LS="$BUILD/harness/lockstep"

if [ $SANITIZE = 1 ]; then
  # sanitize TOOL: the CudaOps cases under the tool, cut at SANITIZE_S seconds; the tool's ERROR
  # SUMMARY (or the cut) goes into summary.md.
  sanitize() {
    local tool="$1" rc=0
    timeout "${SANITIZE_S:-120}" "$SAN" --tool "$tool" --error-exitcode 1 "${GPU_TESTS[@]}" \
      --gtest_filter="$SANITIZE_FILTER" || rc=$?
    if [ $rc -eq 124 ]; then echo "TIMEOUT after ${SANITIZE_S:-120} s: the tests that finished are above"; fi
    return $rc
  }
  step "compute-sanitizer racecheck, $SANITIZE_FILTER" racecheck.log sanitize racecheck
  step "compute-sanitizer synccheck, $SANITIZE_FILTER" synccheck.log sanitize synccheck
  cat "$SUMMARY"
  exit $status
fi

# A test that skips (no device visible) must not count as a pass here: on the lent machine every
# GPU test has to run, except the NCCL hand-off on a machine with a single GPU.
gpu_tests() {
  "${GPU_TESTS[@]}" || return 1
  ! grep "^\[  SKIPPED \]" "$OUT_DIR/gpu_tests.log" | grep -qv SeveralGpusHandOffThroughNccl
}
step "GPU unit tests (CudaOps, CudaEngine, CudaEngineExtra; none may skip but NCCL on 1 GPU)" gpu_tests.log gpu_tests

MODEL="$OUT_DIR/model-$PRESET"
# `small` twice: f32 matrices (the device keeps f32) and bf16 (the device keeps bf16 matrices,
# the product of the same values: the same thresholds hold).
# diff_backends NAME "GENERATE FLAGS" ["CUDA-ONLY FLAGS"]: the same request on cpu and on cuda
# (exports cpu-NAME.h5 / cuda-NAME.h5 with their traces), then the diff at the documented thresholds.
diff_backends() {
  local name="$1" common="$2" cuda_only="${3:-}"
  "$LS" generate $common --backend cpu --export "$OUT_DIR/cpu-$name.h5" --trace-jsonl "$OUT_DIR/cpu-$name.jsonl" || return 1
  "$LS" generate $common --backend cuda $cuda_only --export "$OUT_DIR/cuda-$name.h5" \
    --trace-jsonl "$OUT_DIR/cuda-$name.jsonl" || return 1
  "$LS" diff "$OUT_DIR/cpu-$name.h5" "$OUT_DIR/cuda-$name.h5" --nrmse-max 1e-4 --kl-max 1e-6 \
    --md "$OUT_DIR/cuda_vs_cpu-$name.md" --json "$OUT_DIR/cuda_vs_cpu-$name.json"
}
cuda_vs_cpu() {
  local dtype="$1" model="$MODEL-$1"
  rm -rf "$model" && "$LS" model init --preset "$PRESET" --dtype "$dtype" --out "$model" || return 1
  diff_backends "$dtype" "--model $model --prompt-file campaigns/prompts/demo.txt --spec 0 --max-new 16 --export-windows 0-2"
}
step "cuda vs cpu diff, f32 weights (windows 0-2)" cuda_vs_cpu-f32.log cuda_vs_cpu f32
step "cuda vs cpu diff, bf16 weights (windows 0-2)" cuda_vs_cpu-bf16.log cuda_vs_cpu bf16
MODEL="$MODEL-bf16"

# Attention rows longer than --cuda-attn-split (default 512) run in context ranges and a combine:
# the same diff on a prompt of four copies of the demo text (~760 tokens). A rehearsal keeps the
# short prompt (the emulator's prefill is slow) and splits at 64 positions instead.
long_context() {
  local prompt="$OUT_DIR/long-prompt.txt" split=""
  if [ $REHEARSE = 1 ]; then
    cp campaigns/prompts/demo.txt "$prompt"
    split="--cuda-attn-split 64"
  else
    for i in 1 2 3 4; do cat campaigns/prompts/demo.txt; done >"$prompt"
  fi
  diff_backends long "--model $MODEL --prompt-file $prompt --spec 0 --max-new 8 --export-windows 0-2" "$split"
}
step "cuda vs cpu diff, long context past the attention split (windows 0-2)" cuda_vs_cpu-long.log long_context

# Two fresh processes (CUDA graphs on, the default) must export bitwise the same state, and so must
# a third with every kernel launched from the host (--cuda-graphs off): graphs change launches,
# not arithmetic. Then the predeclared campaign (in a rehearsal a copy on `tiny`, with fewer new
# tokens and timing repeats, so the emulator finishes it in about a minute).
PLAN=campaigns/aa-cuda.toml
MAX_NEW=32
if [ $REHEARSE = 1 ]; then
  PLAN="$OUT_DIR/aa-cuda-rehearsal.toml"
  MAX_NEW=12
  sed -e "s|^preset = \"small\"|preset = \"$PRESET\"|" -e 's|^max_new = .*|max_new = 12|' \
    -e 's|^repeat = .*|repeat = 2|' -e "s|^prompt_file = \"prompts/|prompt_file = \"$PWD/campaigns/prompts/|" \
    campaigns/aa-cuda.toml >"$PLAN"
fi
aa() {
  local common="--model $MODEL --prompt-file campaigns/prompts/demo.txt --backend cuda --spec 4 --max-new $MAX_NEW"
  "$LS" generate $common --export "$OUT_DIR/aa1.h5" >/dev/null &&
  "$LS" generate $common --export "$OUT_DIR/aa2.h5" >/dev/null &&
  "$LS" generate $common --cuda-graphs off --export "$OUT_DIR/aa-eager.h5" >/dev/null &&
  "$LS" diff "$OUT_DIR/aa1.h5" "$OUT_DIR/aa2.h5" --nrmse-max 0 --kl-max 0 &&
  "$LS" diff "$OUT_DIR/aa1.h5" "$OUT_DIR/aa-eager.h5" --nrmse-max 0 --kl-max 0 &&
  rm -rf "$OUT_DIR/aa-cuda" && "$LS" run "$PLAN" --out "$OUT_DIR/aa-cuda"
}
step "deterministic cuda A/A, graphs vs eager (diff NRMSE 0 + campaign aa-cuda)" aa.log aa

# --deterministic off (cuBLAS TF32 GEMMs for verify windows of several rows) must differ from the
# deterministic run, and the product must show it: the exact diff has to fail (exit 1, not 2).
nondet() {
  local common="--model $MODEL --prompt-file campaigns/prompts/demo.txt --backend cuda --spec 4 --max-new $MAX_NEW"
  "$LS" generate $common --deterministic off --export "$OUT_DIR/nondet.h5" >/dev/null || return 1
  "$LS" diff "$OUT_DIR/aa1.h5" "$OUT_DIR/nondet.h5" --nrmse-max 0 --kl-max 0
  [ $? -eq 1 ]
}
step "--deterministic off differs from on (diff at NRMSE 0 must fail)" nondet.log nondet

# Google Benchmark exits 0 when a benchmark reports an error (e.g. "no CUDA device").
bench() {
  "$BUILD/tests/bench/cuda_bench" --benchmark_counters_tabular=true || return 1
  ! grep -q "ERROR OCCURRED" "$OUT_DIR/bench.log"
}
if [ $REHEARSE = 1 ]; then
  # No device: every benchmark reports it, and the step must say FAIL for that.
  no_device_fails_bench() { ! bench && grep -q "no CUDA device" "$OUT_DIR/bench.log"; }
  step "GPU benchmarks (rehearsal: the missing device must fail the step)" bench.log no_device_fails_bench
else
  step "GPU benchmarks" bench.log bench
fi

cat "$SUMMARY"
exit $status
