#!/usr/bin/env bash
# The feature payload over NCCL end to end: CUDA targets stream to a CUDA drafter with pipeline.transport "nccl"
# (one GPU per rank, or the shared-GPU test mode: tests/gpu/nccl_common.sh); the same run over MPI (payloads
# through the pinned mirrors) moves the same bf16 bytes into the same device slots and runs the same
# deterministic kernels, so the losses must be bit-identical (the check allows 1e-6 relative only so that a
# difference prints as a number). Shapes: 1 target + 1 drafter, then 3 targets + 1 drafter.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"
source "$SRC/tests/gpu/nccl_common.sh"
for shape in "1 1" "3 1"; do
  read -r T D <<<"$shape"
  np=$((T + D)) name="${T}t${D}d"
  cuda_config "$TMP/$name-nccl.toml" "$TMP/$name-nccl" "$T" "$D" 8 "${NCCL_TOML[@]}"
  cuda_config "$TMP/$name-mpi.toml" "$TMP/$name-mpi" "$T" "$D" 8 "${MPI_TOML[@]}"
  run_nccl "$np" "$TMP/$name-nccl.log" --config "$TMP/$name-nccl.toml" ||
    { fail "$name: NCCL run"; tail -30 "$TMP/$name-nccl.log"; continue; }
  expect_nccl "$np" "$TMP/$name-nccl.log" "$name"
  grep -q "feature payloads and gradients over NCCL" "$TMP/$name-nccl.log" || fail "$name: the start-up line does not say NCCL"
  for t in $(seq 0 $((T - 1))); do
    grep -q "target $t done: [1-9][0-9]* batches sent" "$TMP/$name-nccl.log" || fail "$name: target $t sent nothing"
  done
  run_mpi "$np" "$TMP/$name-mpi.log" --config "$TMP/$name-mpi.toml" ||
    { fail "$name: MPI run"; tail -30 "$TMP/$name-mpi.log"; continue; }
  grep -q "feature payloads and gradients over MPI" "$TMP/$name-mpi.log" || fail "$name: transport \"mpi\" was not used"
  python3 "$SRC/tests/mpi/compare_losses.py" "$TMP/$name-nccl/metrics.jsonl" "$TMP/$name-mpi/metrics.jsonl" 1e-6 0 \
    "$T CUDA target(s) -> 1 CUDA drafter, feature payloads over NCCL vs MPI, 8 steps" ||
    fail "$name: the NCCL and MPI feature payloads train differently"
done
echo "$fails failed"
[ "$fails" -eq 0 ]
