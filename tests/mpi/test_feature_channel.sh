#!/usr/bin/env bash
# The feature channel's protocol over MPI (tests/unit/test_feature_channel.cpp's MPI cases) for target/drafter
# mixes where each drafter hears from every target (1+2, 2+3), from only some (2+2: target 1 sends drafter 0
# only its END) and more targets than drafters (3+2): batches arrive intact and the drain ends.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 MPIEXEC=$3
TEST_BIN="$(dirname "$BIN")/tests/test_feature_channel"
[ -x "$TEST_BIN" ] || { echo "FAIL: $TEST_BIN not built (cmake --build build --target test_feature_channel)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
fails=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for mix in 1:2 2:3 2:2 3:2; do
  T=${mix%:*} D=${mix#*:}
  DF_TEST_TARGETS=$T timeout 120 "$MPIEXEC" --oversubscribe -x DF_TEST_TARGETS -np $((T + D)) "$TEST_BIN" \
    --gtest_filter='FeatureChannelMpi.*' >"$log" 2>&1
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "FAIL: $T targets + $D drafters (exit $rc; 124: a hang, killed after 120 s):"
    tail -20 "$log"
    fails=$((fails + 1))
  elif grep -q SKIPPED "$log" && ! grep -q "do not split evenly" "$log"; then
    echo "FAIL: $T targets + $D drafters skipped: $(grep -m1 -A1 SKIPPED "$log")"
    fails=$((fails + 1))
  else
    echo "ok: $T targets + $D drafters"
  fi
done
echo "$fails failed"
[ "$fails" -eq 0 ]
