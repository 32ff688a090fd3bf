#!/usr/bin/env bash
# The feature payload over NCCL end to end: 1 CUDA target + 1 CUDA drafter on two GPUs (NCCL refuses two ranks
# on one). pipeline.transport "auto" must pick NCCL and say that it carries the feature payloads; the same run
# with transport "mpi" (payloads through the pinned mirrors) moves the same bf16 bytes into the same device
# slot and runs the same deterministic kernels, so the losses must be bit-identical (the check allows 1e-6
# relative only so that a difference prints as a number). Skips (77) with fewer than 2 GPUs.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$gpus" -ge 2 ] || { echo "SKIP: needs 2 GPUs (NCCL refuses two ranks on one), $gpus visible"; exit 77; }
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on the shared GPU machines (device/KINDS.md)
source "$SRC/tests/mpi/train_common.sh"
cuda_config() {  # FILE RUN_DIR [extra TOML lines]: target and drafter on the GPU (the drafter follows the target)
  write_config "$1" "$2" 1 1 8 "${@:3}"
  sed -i 's/^device = "cpu"$/device = "cuda"/' "$1"
}
cuda_config "$TMP/nccl.toml" "$TMP/nccl"
cuda_config "$TMP/mpi.toml" "$TMP/mpi" "[pipeline]" 'transport = "mpi"'
run_mpi 2 "$TMP/nccl.log" --config "$TMP/nccl.toml" || { fail "NCCL run"; tail -30 "$TMP/nccl.log"; }
for placed in "target0 device cuda:0" "drafter0 device cuda:1"; do
  grep -q "role $placed .*transport nccl" "$TMP/nccl.log" ||
    fail "not '$placed' with transport nccl: $(grep -m1 "role ${placed%% *}" "$TMP/nccl.log")"
done
grep -q "feature payloads and gradients over NCCL" "$TMP/nccl.log" || fail "the start-up line does not say NCCL"
grep -q "target 0 done: [1-9][0-9]* batches sent" "$TMP/nccl.log" || fail "the target sent nothing"
run_mpi 2 "$TMP/mpi.log" --config "$TMP/mpi.toml" || { fail "MPI run"; tail -30 "$TMP/mpi.log"; }
grep -q "feature payloads and gradients over MPI" "$TMP/mpi.log" || fail "transport = \"mpi\" was not used"
python3 "$SRC/tests/mpi/compare_losses.py" "$TMP/nccl/metrics.jsonl" "$TMP/mpi/metrics.jsonl" 1e-6 0 \
  "CUDA target -> CUDA drafter, feature payloads over NCCL vs MPI, 8 steps" ||
  fail "the NCCL and MPI feature payloads train differently"
echo "$fails failed"
[ "$fails" -eq 0 ]
