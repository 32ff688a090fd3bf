#!/usr/bin/env bash
# Two CUDA drafters training offline (no target ranks) on two GPUs: pipeline.transport "auto" picks NCCL (each
# rank owns a GPU), so the gradients are summed by the NCCL reducer in device memory; the same run with
# transport "mpi" sums them through the pinned-staging MPI reducer. Two addends sum to the same float in either
# order, and everything else is the same deterministic CUDA code, so the losses must be bit-identical; the check
# allows 1e-6 relative only so that a difference prints as a number. Skips (77) with fewer than 2 GPUs.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$gpus" -ge 2 ] || { echo "SKIP: needs 2 GPUs (NCCL refuses two ranks on one), $gpus visible"; exit 77; }
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on the shared GPU machines (device/KINDS.md)
source "$SRC/tests/mpi/train_common.sh"
"$BIN" model init --hf-config "$SRC/configs/tiny-target.json" --out "$TMP/target" >/dev/null ||
  { echo "FAIL: model init"; exit 1; }
write_config "$TMP/online.toml" "$TMP/run_on" 1 1 6
sed -i "s|^random_config = .*|model = \"$TMP/target\"|" "$TMP/online.toml"
"$BIN" extract --model "$TMP/target" --tokens "$TMP/tokens.h5" --out "$TMP/feat.h5" --for-config "$TMP/online.toml" \
  >"$TMP/extract.log" 2>&1 || { echo "FAIL: extract: $(tail -3 "$TMP/extract.log")"; exit 1; }
offline_config() {  # FILE RUN_DIR [extra TOML lines]
  write_config "$1" "$2" 0 2 6 "${@:3}"
  sed -i -e "s|^random_config = .*|model = \"$TMP/target\"|" \
    -e "s|^train = .*|features = [\"$TMP/feat.h5\"]|" -e 's/^device = "cpu"$/device = "cuda"/' "$1"
}
offline_config "$TMP/nccl.toml" "$TMP/nccl"
offline_config "$TMP/mpi.toml" "$TMP/mpi" "[pipeline]" 'transport = "mpi"'
run_mpi 2 "$TMP/nccl.log" --config "$TMP/nccl.toml" || { fail "NCCL run"; tail -30 "$TMP/nccl.log"; }
grep -q "transport nccl" "$TMP/nccl.log" ||
  fail "transport auto did not pick NCCL on 2 GPUs: $(grep -m1 transport "$TMP/nccl.log")"
grep -q "NCCL [0-9.]*: world communicator of 2 ranks and drafters communicator of 2, warmed up" "$TMP/nccl.log" ||
  fail "no NCCL start-up line"
run_mpi 2 "$TMP/mpi.log" --config "$TMP/mpi.toml" || { fail "MPI run"; tail -30 "$TMP/mpi.log"; }
grep -q "transport mpi" "$TMP/mpi.log" || fail "transport = \"mpi\" was not used"
python3 "$SRC/tests/mpi/compare_losses.py" "$TMP/nccl/metrics.jsonl" "$TMP/mpi/metrics.jsonl" 1e-6 0 \
  "2 CUDA drafters, NCCL vs MPI gradient sums, 6 steps" || fail "NCCL and MPI gradient sums train differently"
echo "$fails failed"
[ "$fails" -eq 0 ]
