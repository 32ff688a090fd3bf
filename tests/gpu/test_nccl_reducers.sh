#!/usr/bin/env bash
# The device gradient reducers and the NCCL mechanism over 2 and 3 MPI ranks: test_nccl's reducer and multi-rank
# cases under mpirun, where each reducer must return every element N times and 64 MiB must cross every rank pair
# byte for byte. With fewer GPUs than ranks, the ranks share them behind launch/nccl_hostid.sh (their own
# NCCL_HOSTID each: NCCL's socket transport on loopback; tests/gpu/nccl_common.sh). NCCL_DEBUG=INFO's channel
# lines show the transport NCCL chose; the first is printed. Skips (77) without a GPU.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$GPUS" -ge 1 ] || { echo "SKIP: no GPU"; exit 77; }
TEST_BIN="$(dirname "$BIN")/tests/test_nccl"
[ -x "$TEST_BIN" ] || { echo "FAIL: $TEST_BIN not built (cmake --build build --target test_nccl)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0  # multicast off (device/KINDS.md)
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
fails=0
for np in 2 3; do
  prefix=""
  [ "$GPUS" -ge "$np" ] || prefix="$SRC/launch/nccl_hostid.sh"
  # shellcheck disable=SC2086
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout 300 "$MPIEXEC" --oversubscribe -np "$np" $prefix "$TEST_BIN" \
    --gtest_filter='NcclReducerTest.*:NcclWorldTest.*' >"$LOG" 2>&1
  rc=$?
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|ring send/receive:|all-reduce of" "$LOG"
  echo "np $np: $(grep -m1 -oE "Channel 00/0 : [0-9]+\[[0-9]+\] -> [0-9]+\[[0-9]+\] \[(send|receive)\] via [A-Za-z/0-9]+" "$LOG" ||
    grep -m1 -oE "via (NET/[A-Za-z]+|P2P/[A-Za-z]+|SHM)[^ ]*" "$LOG")"
  if [ "$rc" -ne 0 ] || grep -q "SKIPPED" "$LOG" || ! grep -q "PASSED" "$LOG"; then
    echo "FAIL: np $np (exit $rc)"; tail -40 "$LOG"; fails=$((fails + 1))
  fi
done
echo "$fails failed"
[ "$fails" -eq 0 ]
