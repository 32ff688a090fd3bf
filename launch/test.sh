#!/usr/bin/env bash
# The test command: install what is missing, build, run every test (GPU tests skip themselves without one).
# Ends with the 15 slowest tests of the run, passed or not, the wall time of each phase, and ctest's exit status.
set -euo pipefail
source "$(dirname "$0")/setup.sh"
cd "$BUILD_DIR"
rc=0
ctest --output-on-failure -j"$jobs" "$@" || rc=$?
df_phase_done "ctest (the sanitizer tree's build included: sanitize.build)"
# Each test's block in ctest's log names it ("3/520 Test: name") and ends with its wall time ("Test time = 1.23 sec").
# sed, not head: it reads all of sort's output, so no SIGPIPE fails the pipeline.
log=Testing/Temporary/LastTest.log
if [ -f "$log" ]; then
  echo "The 15 slowest tests of this run (seconds):"
  awk '/^[0-9]+\/[0-9]+ Test: / { name = $3 } /^Test time = / { printf "%9.1f  %s\n", $4, name }' "$log" |
    sort -rn | sed -n 1,15p
fi
echo "Wall time of each phase (seconds):"
printf '%s\n' "${DF_PHASES[@]}"
echo "$(printf '%9d' $(($(date +%s) - df_start)))  total"
exit "$rc"
