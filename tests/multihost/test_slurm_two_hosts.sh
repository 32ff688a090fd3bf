#!/usr/bin/env bash
# SLURM across two namespace hosts: one slurmctld and one slurmd per host (each in its own network, UTS and
# mount namespace, so no multiple-slurmd build is needed), then launch/slurm/dflash-srun.sbatch submitted
# with -N2: srun --mpi=pmix starts a target and a drafter on each node with roles from `topo rankfile --host`,
# the run trains to its end and checkpoints. Skips (77) without root, namespaces or the SLURM packages.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$(realpath "$1") SRC=$(realpath "$2") MPIEXEC=$3
# Each slurmd gets a private /tmp (PMIx puts per-step directories there under names that would collide on
# one machine), so everything the job reads lives outside /tmp.
export TMPDIR=/var/tmp
source "$SRC/tests/multihost/netns_hosts.sh"
command -v apt-get >/dev/null || skip "no apt-get: tests/slurm/slurm_up.sh installs SLURM from Debian packages"
# Packages (slurm-wlm munge libpmix-dev) and munged come from the single-node set-up the SLURM test uses; the
# daemons it starts are stopped on exit, before the namespaces (and their slurmctld and slurmds) go.
trap 'bash "$SRC/tests/slurm/slurm_down.sh" "$TMP/daemons_started"; netns_cleanup' EXIT
if ! bash "$SRC/tests/slurm/slurm_up.sh" "$TMP/daemons_started" >"$TMP/slurm_up.log" 2>&1; then
  grep -q "apt-get install .* failed" "$TMP/slurm_up.log" && skip "SLURM packages could not be installed"
  cat "$TMP/slurm_up.log"; echo "FAIL: tests/slurm/slurm_up.sh could not bring SLURM up"; exit 1
fi

S=$TMP/slurm
mkdir -p "$S/ctld" "$S/spool_h1" "$S/spool_h2"
cpus=$(getconf _NPROCESSORS_ONLN)  # what slurmd sees on the hardware (nproc may show a narrower affinity)
# The plugins slurm_up.sh chose for containers (linuxproc, task/none, pmix, no accounting) and its message
# timeout: taken from the file it wrote, so both clusters follow one set of choices.
keys='AuthType|ProctrackType|TaskPlugin|JobAcctGatherType|AccountingStorageType|SelectType|MpiDefault|ReturnToService|MessageTimeout'
common=$(grep -E "^($keys|SelectTypeParameters)=" /etc/slurm/slurm.conf)
cat >"$S/slurm.conf" <<CONF
# Two namespace hosts on one machine (tests/multihost/test_slurm_two_hosts.sh).
ClusterName=dfmh
SlurmctldHost=h1(10.231.0.1)
SlurmUser=root
StateSaveLocation=$S/ctld
SlurmdSpoolDir=$S/spool_%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd_%n.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd_%n.log
$common
NodeName=h1 NodeAddr=10.231.0.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
NodeName=h2 NodeAddr=10.231.0.2 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=mh Nodes=h1,h2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF=$S/slurm.conf
# on HOST NS CMD...: CMD on host HOST. nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup
# filesystem slurmd needs; the host's /etc/hosts and private /tmp are bind-mounted in its own mount namespace.
on() {
  local h=$1 ns=$2
  shift 2
  mkdir -p "$S/tmp_$h" && chmod 1777 "$S/tmp_$h"
  nsenter --net="/run/netns/$ns" unshare --uts --mount /bin/bash -c \
    "mount --bind /etc/netns/$ns/hosts /etc/hosts && mount --bind $S/tmp_$h /tmp && hostname $h && exec \"\$@\"" _ "$@"
}
on h2 "$NS2" true 2>"$TMP/on.err" ||
  skip "cannot bind-mount a namespace host's /etc/hosts and /tmp: $(cat "$TMP/on.err")"
on h1 "$NS1" /usr/sbin/slurmctld -f "$S/slurm.conf" ||
  { fail "slurmctld did not start"; cat "$S/slurmctld.log"; exit 1; }
on h1 "$NS1" /usr/sbin/slurmd -f "$S/slurm.conf" && on h2 "$NS2" /usr/sbin/slurmd -f "$S/slurm.conf" ||
  { fail "slurmd did not start"; cat "$S"/slurmd_*.log; exit 1; }
for _ in $(seq 1 60); do
  on h1 "$NS1" sinfo -h -N -o "%N %t" >"$S/sinfo" 2>&1
  [ "$(grep -c " idle" "$S/sinfo")" -eq 2 ] && break
  sleep 0.5
done
[ "$(grep -c " idle" "$S/sinfo")" -eq 2 ] || { fail "nodes not idle: $(cat "$S/sinfo")"; tail "$S"/*.log; exit 1; }
echo "ok: SLURM up on two namespace hosts: $(tr '\n' ' ' <"$S/sinfo")"

"$BIN" topo rankfile --host "h1=$TMP/sysfs" --host "h2=$TMP/sysfs" --targets 2 --drafters 2 --out "$TMP/rf" \
  >/dev/null 2>&1 || { fail "topo rankfile"; exit 1; }
# The job does not see this machine's /tmp (each slurmd has its own), where a CI checkout may well live: what it
# reads (the binary, the batch script, the target config) is staged under $TMP first.
JOB_SRC=$TMP/src
mkdir -p "$JOB_SRC/launch/slurm" "$JOB_SRC/configs"
cp "$SRC/launch/slurm/dflash-srun.sbatch" "$JOB_SRC/launch/slurm/" && cp "$SRC/configs/tiny-target.json" "$JOB_SRC/configs/" &&
  cp "$BIN" "$TMP/dflash_mpi" || { echo "FAIL: cannot stage the job's files under $TMP"; exit 1; }
(SRC=$JOB_SRC && tiny_config "$TMP/job.toml" "$TMP/job" "$TMP/tokens.h5" 2 2 6)
cd "$TMP" || exit 1
on h1 "$NS1" timeout 240 sbatch --wait -N2 --ntasks-per-node=2 --overcommit --output="$TMP/job.out" \
  --export="ALL,DFLASH_CONFIG=$TMP/job.toml,DFLASH_BIN=$TMP/dflash_mpi,DFLASH_RANKFILE=$TMP/rf" \
  "$JOB_SRC/launch/slurm/dflash-srun.sbatch" >"$TMP/sbatch.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { fail "sbatch --wait exited $rc: $(cat "$TMP/sbatch.log")"; tail "$S"/*.log; }
[ -f "$TMP/job.out" ] || { echo "$fails failed"; exit 1; }
grep -q "2 targets, 2 drafters (roles from DFLASH_RANKFILE" "$TMP/job.out" ||
  fail "rank 0 does not say the roles came from DFLASH_RANKFILE: $(grep -m1 "roles from" "$TMP/job.out")"
for r in "0 h1 target0" "1 h1 drafter0" "2 h2 target1" "3 h2 drafter1"; do
  set -- $r
  grep -qE "^\[rank $1 $2\] pid [0-9]+ host $2 local $(($1 % 2))/2 role $3 " "$TMP/job.out" ||
    fail "srun rank $1: want host $2 role $3: $(grep "^\[rank $1 " "$TMP/job.out" | head -1)"
done
[ -f "$TMP/job/checkpoints/step_00000006.h5" ] || fail "no checkpoint of step 6 in the run dir"
grep -q "srun exited with 0" "$TMP/job.out" || fail "srun did not exit 0"
[ $fails -eq 0 ] && echo "ok: dflash-srun.sbatch -N2: target+drafter on h1 and h2 trained 6 steps and checkpointed"
echo "$fails failed"
[ "$fails" -eq 0 ]
