#!/usr/bin/env bash
# The shared-GPU NCCL test mode's launcher wrapper: gives this rank its own NCCL_HOSTID, so that ranks sharing a
# GPU look like separate hosts to NCCL and talk over its socket transport (on loopback), then runs the command.
#   mpirun -np 2 launch/nccl_hostid.sh dflash_mpi --config F     (F with pipeline.transport = "nccl")
#   srun -n 2 launch/nccl_hostid.sh dflash_mpi --config F
# The rank comes from OMPI_COMM_WORLD_RANK (mpirun; first, since under mpirun inside sbatch SLURM_PROCID is 0 on
# every rank), else SLURM_PROCID (srun), else PMIX_RANK. NCCL_SOCKET_IFNAME defaults to lo, NVLink multicast is
# turned off, and NCCL's buffers grow to 32 MiB with 2 MiB network chunks (on the H200 that took a 64 MiB send
# between two ranks of one GPU from 57 to 33 ms: benchmarks/RESULTS.md); a value already set wins. For tests
# only: real runs leave NCCL_HOSTID unset.
set -euo pipefail
rank=${OMPI_COMM_WORLD_RANK:-${SLURM_PROCID:-${PMIX_RANK:-}}}
if [ -z "$rank" ]; then
  echo "nccl_hostid.sh: no rank in OMPI_COMM_WORLD_RANK, SLURM_PROCID or PMIX_RANK; HINT: run it under mpirun" \
    "or srun, in front of the program: mpirun -np N $0 dflash_mpi ..." >&2
  exit 2
fi
[ $# -gt 0 ] || { echo "nccl_hostid.sh: no command to run; HINT: $0 dflash_mpi --config F" >&2; exit 2; }
export NCCL_HOSTID="dflash-test-$(hostname)-rank$rank"
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export NCCL_BUFFSIZE=${NCCL_BUFFSIZE:-33554432} NCCL_P2P_NET_CHUNKSIZE=${NCCL_P2P_NET_CHUNKSIZE:-2097152}
exec "$@"
