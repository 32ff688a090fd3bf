#!/usr/bin/env bash
# Checkpoint and resume over NCCL (pipeline.transport "nccl": one GPU per rank, or the shared-GPU test mode of
# tests/gpu/nccl_common.sh), CUDA targets and drafters: for 2 targets + 2 drafters and 3 targets + 1 drafter,
# 12 steps straight equal 6 (--stop-at-step) + resume + 6 bit for bit; the step-6 checkpoint of the 3-1 run
# resumed as 1 target + 1 drafter gives the straight run's losses bit for bit (same drafters x grad_accum, so
# the same batches reach the same step), and the 2-2 one resumed as 1 + 1 with grad_accum 4 (the same global
# batch, summed on one drafter instead of all-reduced over two: one fp32 rounding apart, rtol 1e-5).
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"
source "$SRC/tests/gpu/nccl_common.sh"
compare() { python3 "$SRC/tests/mpi/compare_losses.py" "$@"; }
for shape in "2 2" "3 1"; do
  read -r T D <<<"$shape"
  np=$((T + D)) name="${T}t${D}d"
  cuda_config "$TMP/$name.toml" "$TMP/$name" "$T" "$D" 12 "${NCCL_TOML[@]}"
  cuda_config "$TMP/$name-split.toml" "$TMP/$name-split" "$T" "$D" 12 "${NCCL_TOML[@]}"
  run_nccl "$np" "$TMP/$name.log" --config "$TMP/$name.toml" || { fail "$name: straight run"; tail -30 "$TMP/$name.log"; continue; }
  expect_nccl "$np" "$TMP/$name.log" "$name"
  run_nccl "$np" "$TMP/$name-a.log" --config "$TMP/$name-split.toml" --stop-at-step 6 ||
    { fail "$name: first half"; tail -30 "$TMP/$name-a.log"; continue; }
  run_nccl "$np" "$TMP/$name-b.log" --config "$TMP/$name-split.toml" || { fail "$name: resume"; tail -30 "$TMP/$name-b.log"; continue; }
  grep -q "resumed from .*step_00000006.h5 at step 6" "$TMP/$name-b.log" || fail "$name: the second half did not resume at step 6"
  compare "$TMP/$name/metrics.jsonl" "$TMP/$name-split/metrics.jsonl" 0 0 "$name over NCCL: 12 straight vs 6 + resume + 6" ||
    fail "$name: the resumed run's losses differ"
  # The step-6 checkpoint resumed as 1 target + 1 drafter, in a run dir of its own.
  one="$TMP/$name-as-1t1d"
  mkdir -p "$one/checkpoints" && cp "$TMP/$name-split/checkpoints/step_00000006.h5" "$one/checkpoints/" &&
    echo "step_00000006.h5" >"$one/checkpoints/latest"
  sed '/"step":6,/q' "$TMP/$name-split/metrics.jsonl" >"$one/metrics.jsonl"
  cuda_config "$one.toml" "$one" 1 1 12 "${NCCL_TOML[@]}"
  rtol=0
  if [ "$D" -eq 2 ]; then sed -i 's/^grad_accum = 2$/grad_accum = 4/' "$one.toml"; rtol=1e-5; fi
  run_nccl 2 "$one.log" --config "$one.toml" || { fail "$name resumed as 1t1d"; tail -30 "$one.log"; continue; }
  grep -q "resumed from .*step_00000006.h5 at step 6" "$one.log" || fail "$name as 1t1d: did not resume at step 6"
  compare "$TMP/$name/metrics.jsonl" "$one/metrics.jsonl" "$rtol" 0 "$name's step 6 resumed as 1 target + 1 drafter" ||
    fail "$name: the 1t1d resume's losses differ"
done
echo "$fails failed"
[ "$fails" -eq 0 ]
