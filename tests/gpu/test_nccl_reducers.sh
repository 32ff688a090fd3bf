#!/usr/bin/env bash
# The device gradient reducers over two MPI ranks: test_nccl's reducer cases under mpirun -np 2, where each
# must return every element doubled. The pinned-staging MPI reducer runs on one GPU (the ranks share it); the
# NCCL one needs two GPUs (rank r on GPU r) and skips itself on one. Skips (77) without a GPU.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 MPIEXEC=$3
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }
TEST_BIN="$(dirname "$BIN")/tests/test_nccl"
[ -x "$TEST_BIN" ] || { echo "FAIL: $TEST_BIN not built (cmake --build build --target test_nccl)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0  # multicast off (device/KINDS.md)
timeout 300 "$MPIEXEC" --oversubscribe -np 2 "$TEST_BIN" --gtest_filter='NcclReducerTest.*'
