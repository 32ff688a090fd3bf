# Shared by the NCCL GPU tests: how N ranks talk NCCL on this machine. With N GPUs or more each rank owns one;
# with fewer (the one-GPU H200), every rank runs behind launch/nccl_hostid.sh, which gives it its own
# NCCL_HOSTID, so the ranks that share a GPU form a real communicator over NCCL's socket transport on loopback
# (the shared-GPU test mode). Either way the configs ask for pipeline.transport = "nccl", so a run that cannot
# use NCCL fails instead of falling back. Sourced after tests/mpi/train_common.sh; skips (77) without a GPU.
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$GPUS" -ge 1 ] || { echo "SKIP: no GPU"; exit 77; }
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on the shared GPU machines (device/KINDS.md)
NCCL_TOML=("[pipeline]" 'transport = "nccl"')
MPI_TOML=("[pipeline]" 'transport = "mpi"')

# nccl_prefix NP: the command in front of the program for NP ranks ("" when every rank owns a GPU).
nccl_prefix() { [ "$GPUS" -ge "$1" ] || echo "$SRC/launch/nccl_hostid.sh"; }

# run_nccl NP LOG args...: dflash_mpi under mpirun with NCCL for NP ranks; returns its exit code.
run_nccl() {
  local np=$1 log=$2
  shift 2
  # shellcheck disable=SC2046
  timeout 300 "$MPIEXEC" --oversubscribe -np "$np" $(nccl_prefix "$np") "$BIN" "$@" >"$log" 2>&1
}

# expect_nccl NP LOG LABEL: the run's start-up says NCCL carried it, in the test mode when its ranks share GPUs.
expect_nccl() {
  local np=$1 log=$2 label=$3
  grep -q "NCCL [0-9.]*: world communicator of $np ranks" "$log" || fail "$label: no NCCL start-up line"
  if [ "$GPUS" -lt "$np" ]; then
    grep -q "NCCL over sockets: ranks share GPU .* (test mode)" "$log" || fail "$label: the test mode is not said"
  fi
  if grep -q "transport mpi" "$log"; then fail "$label: a rank ran on the MPI transport"; fi
}

# cuda_config FILE RUN_DIR TARGETS DRAFTERS STEPS [extra TOML lines]: the tiny run with target and drafter on CUDA.
cuda_config() {
  write_config "$@"
  sed -i 's/^device = "cpu"$/device = "cuda"/' "$1"
}
