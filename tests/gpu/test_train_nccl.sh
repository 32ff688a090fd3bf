#!/usr/bin/env bash
# CUDA drafters training offline (no target ranks) with pipeline.transport "nccl" (one GPU per rank, or the
# shared-GPU test mode: tests/gpu/nccl_common.sh): the gradients are summed by the NCCL reducer in device
# memory; the same run with transport "mpi" sums them through the pinned-staging MPI reducer. Everything else is
# the same deterministic CUDA code. With 2 drafters the two addends sum to the same float in either order, so
# the losses must be bit-identical; with 3, NCCL's ring may add in another order than MPI's reduction, so the
# check allows one fp32 rounding of the sum per step (rtol 1e-5) and prints whether they were identical.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"
source "$SRC/tests/gpu/nccl_common.sh"
"$BIN" model init --hf-config "$SRC/configs/tiny-target.json" --out "$TMP/target" >/dev/null ||
  { echo "FAIL: model init"; exit 1; }
write_config "$TMP/online.toml" "$TMP/run_on" 1 1 6
sed -i "s|^random_config = .*|model = \"$TMP/target\"|" "$TMP/online.toml"
"$BIN" extract --model "$TMP/target" --tokens "$TMP/tokens.h5" --out "$TMP/feat.h5" --for-config "$TMP/online.toml" \
  >"$TMP/extract.log" 2>&1 || { echo "FAIL: extract: $(tail -3 "$TMP/extract.log")"; exit 1; }
offline_config() {  # FILE RUN_DIR DRAFTERS [extra TOML lines]
  write_config "$1" "$2" 0 "$3" 6 "${@:4}"
  sed -i -e "s|^random_config = .*|model = \"$TMP/target\"|" \
    -e "s|^train = .*|features = [\"$TMP/feat.h5\"]|" -e 's/^device = "cpu"$/device = "cuda"/' "$1"
}
for D in 2 3; do
  offline_config "$TMP/nccl$D.toml" "$TMP/nccl$D" "$D" "${NCCL_TOML[@]}"
  offline_config "$TMP/mpi$D.toml" "$TMP/mpi$D" "$D" "${MPI_TOML[@]}"
  run_nccl "$D" "$TMP/nccl$D.log" --config "$TMP/nccl$D.toml" || { fail "NCCL run, $D drafters"; tail -30 "$TMP/nccl$D.log"; continue; }
  expect_nccl "$D" "$TMP/nccl$D.log" "$D drafters"
  grep -q "drafters communicator of $D, warmed up" "$TMP/nccl$D.log" || fail "$D drafters: no drafters communicator"
  run_mpi "$D" "$TMP/mpi$D.log" --config "$TMP/mpi$D.toml" || { fail "MPI run, $D drafters"; tail -30 "$TMP/mpi$D.log"; continue; }
  grep -q "transport mpi" "$TMP/mpi$D.log" || fail "transport = \"mpi\" was not used"
  rtol=0
  [ "$D" -gt 2 ] && rtol=1e-5
  python3 "$SRC/tests/mpi/compare_losses.py" "$TMP/nccl$D/metrics.jsonl" "$TMP/mpi$D/metrics.jsonl" "$rtol" 0 \
    "$D CUDA drafters, NCCL vs MPI gradient sums, 6 steps" || fail "$D drafters: NCCL and MPI gradient sums train differently"
done
echo "$fails failed"
[ "$fails" -eq 0 ]
