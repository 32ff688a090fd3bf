#!/usr/bin/env bash
# Stand-in for `dflash_mpi train --config F` used by tests/mpi/test_slurm.sh only while the build has no
# `train` subcommand: a rank that steps until run.max_steps, stops early on USR1/TERM, and (rank 0) writes
# <run.dir>/checkpoints/step_XXXXXXXX.h5 and `latest` the way training does. It proves the SLURM plumbing
# (launch, signal delivery, exit codes), not training.
set -u
[ "${1:-}" = train ] && [ "${2:-}" = --config ] && [ -n "${3:-}" ] || { echo "fake_train: usage: train --config F" >&2; exit 2; }
cfg=$3
run_dir=$(sed -n 's/^dir *= *"\(.*\)".*/\1/p' "$cfg" | head -n1)
max_steps=$(sed -n 's/^max_steps *= *\([0-9]*\).*/\1/p' "$cfg" | head -n1)
rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-0}}}
stop=""
trap 'stop=USR1' USR1
trap 'stop=TERM' TERM
step=0
while [ -z "$stop" ] && [ "$step" -lt "${max_steps:-10}" ]; do
  step=$((step + 1))
  [ "$rank" -eq 0 ] && echo "fake_train: step $step"
  sleep 0.2
done
if [ "$rank" -eq 0 ]; then
  [ -n "$stop" ] && echo "fake_train: $stop at step $step: checkpointing"
  mkdir -p "$run_dir/checkpoints"
  name=$(printf 'step_%08d.h5' "$step")
  echo fake >"$run_dir/checkpoints/$name"
  echo "$name" >"$run_dir/checkpoints/latest"
  echo "fake_train: wrote $run_dir/checkpoints/$name"
fi
exit 0
