#!/usr/bin/env bash
# Stands in for compute-sanitizer in `check.sh --rehearse --sanitize` (no GPU, no tool): takes
# the tool's options (--tool NAME, --error-exitcode N), runs the program and ends with the tool's
# summary line, so CI proves the script's sanitizer steps without a device. It checks nothing.
set -u
tool="" code=1
while [ $# -gt 0 ]; do
  case "$1" in
    --tool) tool="$2"; shift 2 ;;
    --error-exitcode) code="$2"; shift 2 ;;
    --*) echo "fake-compute-sanitizer: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ -n "$tool" ] || { echo "fake-compute-sanitizer: no --tool" >&2; exit 2; }
echo "========= COMPUTE-SANITIZER (rehearsal stand-in, tool $tool: nothing is checked)"
"$@"
rc=$?
echo "========= ERROR SUMMARY: 0 errors (rehearsal stand-in)"
if [ $rc -ne 0 ]; then exit $rc; fi
exit 0
