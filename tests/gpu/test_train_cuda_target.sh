#!/usr/bin/env bash
# The whole pipeline with the target on the GPU: 1 CUDA target rank + 1 CPU drafter rank sharing one GPU
# (the MPI feature channel; NCCL refuses two ranks on one device). Skips (77) without a GPU.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }
source "$SRC/tests/mpi/train_common.sh"
write_config "$TMP/gpu.toml" "$TMP/gpu" 1 1 8
sed -i 's/^device = "cpu"$/device = "cuda"/' "$TMP/gpu.toml"
if ! run_mpi 2 "$TMP/gpu.log" --config "$TMP/gpu.toml"; then fail "CUDA-target run"; tail -30 "$TMP/gpu.log"; fi
grep -q "role target0 device cuda:0" "$TMP/gpu.log" || fail "the target did not run on cuda:0"
[ -f "$TMP/gpu/checkpoints/step_00000008.h5" ] || fail "no checkpoint for step 8"
grep -E "^step|fits" "$TMP/gpu.log" | tail -3
echo "$fails failed"
[ "$fails" -eq 0 ]
