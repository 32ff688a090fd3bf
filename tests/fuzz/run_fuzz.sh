#!/usr/bin/env bash
# Runs one libFuzzer target for a fixed time from its seed corpus under ASan + UBSan; exit 0 only when it finds
# nothing. A finding prints the reproducer's path and the command that replays it.
# Args: <fuzz binary> <seed corpus dir> <work dir> <seconds>
#
# Reproducible by default: the mutation sequence comes from DF_FUZZ_SEED (fixed), so a test run explores the same
# inputs on every host and a faster host only goes further along the same sequence; the project fuzzes that
# sequence for several times the test's length before a change lands (README.md, "fuzz"), so CI does not
# turn up a new finding by luck. DF_FUZZ_SEED=0 lets libFuzzer pick a seed: use it to explore.
set -uo pipefail
BIN=$1 SEEDS=$2 WORK=$3 SECONDS_=$4
name=$(basename "$BIN")
rm -rf "$WORK" && mkdir -p "$WORK/corpus" "$WORK/artifacts"
# Leak checks stay on: a parser that leaks on a refused input is a finding too. UB is fatal (-fno-sanitize-recover).
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Single-threaded: libhdf5 and OpenBLAS threads would only blur the coverage signal.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 TMPDIR="$WORK"
SEED=${DF_FUZZ_SEED:-20261201}
"$BIN" -seed="$SEED" -max_total_time="$SECONDS_" -timeout=20 -rss_limit_mb=4096 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$WORK/artifacts/" "$WORK/corpus" "$SEEDS" >"$WORK/log.txt" 2>&1
rc=$?
tail -n 15 "$WORK/log.txt"
found=$(ls "$WORK/artifacts" 2>/dev/null | head -1)
if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
  echo "FUZZ FINDING in $name (exit $rc); full log: $WORK/log.txt"
  [ -n "$found" ] && echo "reproducer: $WORK/artifacts/$found  (replay: $BIN $WORK/artifacts/$found)"
  exit 1
fi
runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$WORK/log.txt" | grep -o '[0-9]*$')
echo "$name: no finding in ${SECONDS_} s ($runs runs, seed $SEED)"
