#!/usr/bin/env bash
# Real SLURM on this machine (tests/slurm/slurm_up.sh), then the launch/slurm recipes as users run them:
#   (a) launch/slurm/dflash.sbatch (mpirun inside sbatch) runs a short CPU training job to its end,
#   (b) launch/slurm/dflash-srun.sbatch (srun --mpi=pmix) runs the same,
#   (c) a dflash.sbatch job gets USR1 (`scancel --signal=USR1 --batch`, what --signal=B:USR1@300 delivers) as
#       soon as its batch script has started, before the ranks are up as a rule: the script creates the stop
#       file the ranks watch, and they must checkpoint and exit 0 (a USR1 sent to ranks still starting killed
#       them, and one that came before the script's trap killed the script);
#   (d) a dflash-srun.sbatch job through SLURM's own timer: --time=2 --signal=B:USR1@40 must end COMPLETED,
#       not TIMEOUT. SLURM may send the signal up to 60 s early (sbatch(1), --signal), so it comes 20-80 s into
#       the job: never before the batch script runs. (With --time=1 it could come, and once came, before the
#       script existed: lost, and the job ran to its limit.)
# (a) and (b) get --time=10, so that the scripts' own --signal=B:USR1@300 cannot come while they run.
# Each must end COMPLETED with exit 0:0 and leave <run.dir>/checkpoints/step_*.h5 and `latest`. Without root,
# apt or a schedulable node the test skips (exit 77); a job still pending or running past its deadline also
# skips, with the job's output; anything else that goes wrong fails. Args: binary, source dir, mpiexec.
set -uo pipefail
BIN=$(realpath "$1")
SRC=$(realpath "$2")
TMP=$(mktemp -d /tmp/dflash-slurm.XXXXXX)
chmod 755 "$TMP"
JOB_TIMEOUT=${DF_SLURM_JOB_TIMEOUT:-120}  # seconds per job wait; the test takes ~2-3 minutes
fails=0
jobs_submitted=()

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# On exit: jobs cancelled (and given 30 s to end, so no rank outlives its slurmd), then the daemons
# slurm_up.sh started stopped, the scratch folder removed.
cleanup() {
  local j
  for j in "${jobs_submitted[@]}"; do scancel "$j" 2>/dev/null; done
  for _ in $(seq 30); do
    [ "${#jobs_submitted[@]}" -eq 0 ] ||
      [ -z "$(squeue -h -t PD,R,CG -j "$(IFS=,; echo "${jobs_submitted[*]}")" 2>/dev/null)" ] && break
    sleep 1
  done
  bash "$SRC/tests/slurm/slurm_down.sh" "$TMP/daemons_started"
  [ -n "${DF_SLURM_KEEP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT

[ "$(id -u)" -eq 0 ] || skip "needs root to install and start munge/slurmctld/slurmd"
command -v apt-get >/dev/null || skip "no apt-get: tests/slurm/slurm_up.sh installs SLURM from Debian packages"
if ! bash "$SRC/tests/slurm/slurm_up.sh" "$TMP/daemons_started" >"$TMP/slurm_up.log" 2>&1; then
  cat "$TMP/slurm_up.log"
  grep -q "apt-get install .* failed" "$TMP/slurm_up.log" && skip "SLURM packages could not be installed"
  echo "FAIL: tests/slurm/slurm_up.sh could not bring SLURM up"
  exit 1
fi
cat "$TMP/slurm_up.log"

# A CPU config: the tiny random target, 2 targets + 1 drafter, roles from [topology].
"$BIN" data synth --out "$TMP/tokens.h5" --vocab 255 --sequences 64 --min-len 32 --max-len 128 --seed 1 \
  >"$TMP/synth.log" 2>&1 || { cat "$TMP/synth.log"; echo "FAIL: data synth"; exit 1; }
source "$SRC/tests/mpi/tiny_config.sh"
write_config() {  # DIR MAX_STEPS
  mkdir -p "$1"
  tiny_config "$1/run.toml" "$1/run" "$TMP/tokens.h5" 2 1 "$2"
}

# submit SCRIPT DIR [sbatch options...]: prints the job id.
submit() {
  local script=$1 dir=$2
  shift 2
  sbatch --parsable -N1 -n3 --overcommit --oversubscribe --time=10 --chdir="$dir" \
    --output="$dir/job.out" \
    --export="ALL,DFLASH_CONFIG=$dir/run.toml,DFLASH_BIN=$BIN,DFLASH_RANKFILE=none,OMPI_MCA_rmaps_base_oversubscribe=1,OMP_NUM_THREADS=1" \
    "$@" "$SRC/launch/slurm/$script"
}

job_field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n1; }

# wait_job ID DIR: waits for a final state; prints it. Past JOB_TIMEOUT: cancels and skips.
wait_job() {
  local id=$1 dir=$2 state=""
  for _ in $(seq "$JOB_TIMEOUT"); do
    state=$(job_field "$id" JobState)
    case "$state" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        echo "$state"
        return ;;
    esac
    sleep 1
  done
  echo "job $id still $state after ${JOB_TIMEOUT}s (reason $(job_field "$id" Reason)); its output:" >&2
  tail -n 30 "$dir/job.out" >&2
  scancel "$id"
  skip "job $id did not finish within ${JOB_TIMEOUT}s (slow machine?); raise DF_SLURM_JOB_TIMEOUT to wait longer"
}

# check_done NAME ID DIR: COMPLETED, exit 0:0, checkpoint and latest pointer in the run dir.
check_done() {
  local name=$1 id=$2 dir=$3 state
  state=$(wait_job "$id" "$dir") || exit $?
  local code
  code=$(job_field "$id" ExitCode)
  echo "$name: job $id $state exit $code"
  if [ "$state" != COMPLETED ] || [ "$code" != 0:0 ]; then
    fail "$name: job $id ended $state with exit $code; output:"
    cat "$dir/job.out"
    return
  fi
  ls "$dir"/run/checkpoints/step_*.h5 >/dev/null 2>&1 || fail "$name: no $dir/run/checkpoints/step_*.h5"
  [ -s "$dir/run/checkpoints/latest" ] || fail "$name: no $dir/run/checkpoints/latest"
}

# (a) and (b) run side by side (each asks for one core with --overcommit).
write_config "$TMP/a" 6
write_config "$TMP/b" 6
ida=$(submit dflash.sbatch "$TMP/a") || { echo "FAIL: sbatch dflash.sbatch"; exit 1; }
jobs_submitted+=("$ida")
idb=$(submit dflash-srun.sbatch "$TMP/b") || { echo "FAIL: sbatch dflash-srun.sbatch"; exit 1; }
jobs_submitted+=("$idb")
check_done "(a) sbatch+mpirun" "$ida" "$TMP/a"
check_done "(b) sbatch+srun --mpi=pmix" "$idb" "$TMP/b"

# (c) a long run stopped by USR1 as soon as its batch script runs; (d) a long run stopped by the time-limit
# signal.
write_config "$TMP/c" 1000000
write_config "$TMP/d" 1000000
idc=$(submit dflash.sbatch "$TMP/c") || { echo "FAIL: sbatch (c)"; exit 1; }
jobs_submitted+=("$idc")
idd=$(submit dflash-srun.sbatch "$TMP/d" --time=2 --signal=B:USR1@40) || { echo "FAIL: sbatch (d)"; exit 1; }
jobs_submitted+=("$idd")
started=0
for _ in $(seq "$((JOB_TIMEOUT * 10))"); do  # the script's first line comes after its trap
  if grep -q "dflash.sbatch: job" "$TMP/c/job.out" 2>/dev/null; then
    started=1
    break
  fi
  case "$(job_field "$idc" JobState)" in COMPLETED | FAILED | CANCELLED | TIMEOUT) break ;; esac
  sleep 0.1
done
if [ "$started" -eq 1 ]; then
  scancel --signal=USR1 --batch "$idc" || fail "(c): scancel --signal=USR1 --batch $idc"
  check_done "(c) USR1 at start -> checkpoint" "$idc" "$TMP/c"
  grep -q "USR1" "$TMP/c/job.out" || fail "(c): the batch script never saw USR1"
  grep -q "stop requested (signal or stop file on some rank): checkpointed step" "$TMP/c/job.out" ||
    fail "(c): the ranks never logged the stop"
  [ ! -e "$TMP/c/dflash-stop-$idc.0" ] || fail "(c): the stop file was left behind"
else
  fail "(c): job $idc never started its batch script; output:"
  cat "$TMP/c/job.out"
fi
check_done "(d) srun, --time=2 --signal=B:USR1@40 -> checkpoint" "$idd" "$TMP/d"
grep -q "USR1" "$TMP/d/job.out" || fail "(d): the batch script never saw USR1"

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all SLURM checks passed"
