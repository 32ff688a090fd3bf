#!/usr/bin/env bash
# Brings up a real single-node SLURM (munge, slurmctld, slurmd) without systemd, for CI and for trying the
# launch/slurm recipes on one machine. Idempotent: installs only what is missing, starts only daemons that
# are not running, rewrites slurm.conf only when it changed. Needs root. Ends with the node idle in `sinfo`.
# Container notes (see shared LAUNCH.md): proctrack/cgroup crashes slurmd there, so linuxproc + task/none.
# Args: [STARTED_FILE]: each daemon it starts (munged, slurmctld, slurmd) is appended to that file by name, so
# that tests/slurm/slurm_down.sh STARTED_FILE stops exactly those and leaves ones that were already running.
set -euo pipefail
STARTED=${1:-/dev/null}

CONF=/etc/slurm/slurm.conf
PARTITION=${DF_SLURM_PARTITION:-debug}
log() { echo "slurm_up: $*"; }
die() { echo "slurm_up: ERROR: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts munged/slurmctld/slurmd)"

# 1. Packages. libpmix-dev provides the unversioned libpmix.so that Debian's mpi/pmix plugin loads.
packages=(slurm-wlm munge libpmix-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    die "apt-get install ${missing[*]} failed"
fi

# pid_alive FILE: the daemon whose pid FILE holds is running.
pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# 2. munge. Nothing creates /run/munge without systemd; the key normally comes with the package.
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if [ ! -s /etc/munge/munge.key ]; then
  log "creating /etc/munge/munge.key"
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged --force
  echo munged >>"$STARTED"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || die "munged does not answer (see /var/log/munge/munged.log)"
fi

# 3. slurm.conf: this node as `slurmd -C` sees it, one oversubscribable partition, no accounting.
host=$(hostname -s)
node_line=$(slurmd -C | head -n1)
[[ "$node_line" == NodeName=* ]] || die "'slurmd -C' printed '$node_line', expected a NodeName= line"
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
chown slurm:slurm /var/spool/slurmctld /var/log/slurm
new_conf=$(cat <<EOF
# Written by tests/slurm/slurm_up.sh: single-node SLURM for CI (no systemd, no cgroups, no accounting).
ClusterName=dflashci
SlurmctldHost=$host
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
# A 2-core CI machine under a parallel ctest can leave slurmd unanswered for over the 10 s default; the
# controller then drops the step's messages and srun's PMIx wire-up fails in the ranks.
MessageTimeout=60
SchedulerType=sched/backfill
MinJobAge=600
$node_line State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
)
conf_changed=0
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$new_conf" ]; then
  log "writing $CONF"
  printf '%s\n' "$new_conf" >"$CONF"
  conf_changed=1
fi

# 4. Daemons. A changed config restarts the ones this script started earlier (found by their pid files).
if ((conf_changed)); then
  for pf in /run/slurmd.pid /run/slurmctld.pid; do
    if pid_alive "$pf"; then
      log "config changed: stopping pid $(cat "$pf") ($pf)"
      kill "$(cat "$pf")"
      for _ in $(seq 50); do pid_alive "$pf" || break; sleep 0.1; done
    fi
  done
fi
if ! pid_alive /run/slurmctld.pid; then
  log "starting slurmctld"
  /usr/sbin/slurmctld || die "slurmctld failed to start (see /var/log/slurm/slurmctld.log)"
  echo slurmctld >>"$STARTED"
fi
if ! pid_alive /run/slurmd.pid; then
  log "starting slurmd"
  /usr/sbin/slurmd || die "slurmd failed to start (see /var/log/slurm/slurmd.log)"
  echo slurmd >>"$STARTED"
fi

# 5. Wait for the node to be schedulable. A node left down/drained by an earlier run is resumed.
state=""
for i in $(seq 60); do
  state=$(sinfo -h -N -n "$host" -o %T 2>/dev/null | head -n1 || true)
  case "$state" in
    idle | mixed | allocated) break ;;
    down* | drain* | drained*)
      ((i % 5 == 1)) && scontrol update NodeName="$host" State=RESUME 2>/dev/null || true ;;
  esac
  sleep 1
done
case "$state" in
  idle | mixed | allocated) ;;
  *) die "node $host is '${state:-unknown}' after 60 s; see /var/log/slurm/slurmd.log and slurmctld.log" ;;
esac
log "up: node $host $state, partition $PARTITION ($(sinfo -h -o '%c CPUs' -n "$host" | head -n1))"
