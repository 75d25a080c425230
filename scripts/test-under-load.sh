#!/usr/bin/env bash
# `make test-under-load`: the e2e suites (ctest label e2e: the campaigns, the service, the server,
# golden) beside a CPU hog of one busy process per core at normal priority, RUNS times in a row
# (default 3). Every run must pass as it is: no retry, no rerun of failures. Catches tests that
# lean on timing (a deadline too tight for a loaded machine, a /proc scan racing an exit).
# Not part of `make test` (it takes RUNS times the e2e suites' time, slowed by the hog).
set -euo pipefail
BUILD=${BUILD:-build}
RUNS=${RUNS:-3}
JOBS=${JOBS:-$(nproc)}
[ -d "$BUILD" ] || { echo "test-under-load: no build folder $BUILD (run make build)" >&2; exit 2; }
hogs=()
stop_hogs() { for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_hogs EXIT
for _ in $(seq "$(nproc)"); do
  (while :; do :; done) &
  hogs+=($!)
done
for r in $(seq "$RUNS"); do
  t0=$(date +%s)
  echo "test-under-load: run $r of $RUNS beside ${#hogs[@]} busy processes"
  if ! (cd "$BUILD" && ctest -L e2e --output-on-failure -j"$JOBS" --timeout 900); then
    echo "test-under-load: run $r of $RUNS failed" >&2
    exit 1
  fi
  echo "test-under-load: run $r passed in $(($(date +%s) - t0)) s"
done
echo "test-under-load: $RUNS runs in a row passed"
