#!/usr/bin/env bash
# The decode kernels' A/B rows, compared across passes: `bench_kernels decode [T]` PASSES times, the odd passes
# in the bench's mode order and the even ones reversed (DF_BENCH_DECODE_REVERSE=1), since the GPU machine can
# slow down for stretches of a run (benchmarks/RESULTS.md, "How to read them"). Each pass checks every row against
# CpuOps before timing it. Then one line per row: its median us over the passes, min and max, its median
# ratio to the bandwidth time, and for a switch's row ([tag]) its median change against the default row of
# the same kernel and shape and how many passes it was faster in. GPU machine only.
#
#   benchmarks/run_decode_ab.sh [BUILD_DIR] [T] [PASSES]     (defaults: build, both step lengths, 4)
# Environment: DF_BENCH_TIMEOUT seconds per pass (default 300). Logs go to $BUILD_DIR/decode_ab/pass<N>.log,
# replacing the logs of an earlier run there (nothing else is written).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$here/build}"
T="${2:-}"
passes="${3:-4}"
timeout_s="${DF_BENCH_TIMEOUT:-300}"
bench="$build/benchmarks/bench_kernels"
die() { echo "run_decode_ab: $*" >&2; exit 2; }
[[ -x "$bench" ]] || die "$bench not built. HINT: cmake --build $build -j --target bench_kernels"
[[ -z "$T" || "$T" == 1 || "$T" == 16 ]] || die "T must be 1 or 16 (or empty for both), got '$T'"
[[ "$passes" =~ ^[1-9][0-9]*$ ]] || die "PASSES must be a positive integer, got '$passes'"
logs="$build/decode_ab"
mkdir -p "$logs"
rc=0
for ((p = 1; p <= passes; p++)); do
  reverse=$((1 - p % 2))
  echo "== pass $p of $passes ($([[ $reverse == 1 ]] && echo reversed || echo forward) mode order)"
  DF_BENCH_DECODE_REVERSE=$reverse timeout "$timeout_s" "$bench" decode $T >"$logs/pass$p.log" 2>&1 ||
    { echo "bench_kernels decode $T, pass $p: FAILED (rc $?); its log: $logs/pass$p.log"; tail -5 "$logs/pass$p.log"; rc=1; }
done
python3 "$here/benchmarks/decode_ab_summary.py" "$logs"/pass*.log || rc=1
exit $rc
