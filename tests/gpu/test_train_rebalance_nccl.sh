#!/usr/bin/env bash
# Role rebalancing on CUDA ranks over NCCL: tests/mpi/test_train_rebalance.sh's cases (2-2 with slowed targets
# moves to 3-1 by itself, bit for bit what a stop and a resume 3-1 by hand train; a rank killed during the move
# ends the job naming it and the move's checkpoint resumes; advise and pinned ranks move nothing) with
# target.device = drafter.device = "cuda" and pipeline.transport = "nccl", ranks started as
# tests/gpu/nccl_common.sh starts them (the shared-GPU test mode on one GPU). Skips (77) without a GPU.
# Args: <dflash_mpi> <source dir> <mpiexec>
REBALANCE_ON_GPU=1 exec bash "$2/tests/mpi/test_train_rebalance.sh" "$@"
