#!/usr/bin/env bash
# `make demo` builds the `lockstep` target alone (the test suite is `make test`'s) and times the
# build and the campaign (issue 42): checked on `make -n demo`'s commands, nothing is built.
#   demo_target_test.sh SOURCE_DIR
set -euo pipefail
cmds=$(make -s -n -C "$1" demo BUILD=/nonexistent/build 2>&1)
builds=$(grep -c 'cmake --build' <<<"$cmds" || true)
[ "$builds" = 1 ] || { echo "make demo runs $builds cmake --build commands:"; echo "$cmds"; exit 1; }
grep -q 'cmake --build /nonexistent/build .*--target lockstep' <<<"$cmds" ||
  { echo "make demo does not build --target lockstep alone:"; echo "$cmds"; exit 1; }
grep -q 'demo: built the lockstep target in' <<<"$cmds" || { echo "no build time printed"; exit 1; }
grep -q 'demo: the aa-demo campaign ran in' <<<"$cmds" || { echo "no campaign time printed"; exit 1; }
echo "make demo: one target (lockstep), build and campaign timed"
