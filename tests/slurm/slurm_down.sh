#!/usr/bin/env bash
# Stops the daemons that tests/slurm/slurm_up.sh STARTED_FILE started, as that file lists them (slurmd, then
# slurmctld, then munged), each by the pid file it wrote: a test leaves the machine's daemons as it found them.
# Daemons that were running before slurm_up.sh are not in the file and keep running. Needs root.
# Args: STARTED_FILE
set -uo pipefail
STARTED=$1
[ -s "$STARTED" ] || exit 0

# stop NAME PIDFILE: SIGTERM, then SIGKILL after 10 s.
stop() {
  local name=$1 pf=$2 pid
  grep -qx "$name" "$STARTED" || return 0
  [ -s "$pf" ] && pid=$(cat "$pf") && kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || { echo "slurm_down: stopped $name (pid $pid)"; return 0; }
    sleep 0.1
  done
  echo "slurm_down: $name (pid $pid) still running 10 s after SIGTERM: killed"
  kill -9 "$pid" 2>/dev/null
}
stop slurmd /run/slurmd.pid
stop slurmctld /run/slurmctld.pid
stop munged /run/munge/munged.pid
