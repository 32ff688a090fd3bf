#!/usr/bin/env bash
# Failures end the whole job: a killed rank, a stopped rank (its watchdog-waiting peers, or its missing
# heartbeats within 60 s) or a rank that hits an error makes every rank exit non-zero within a bounded time,
# naming the rank; SIGUSR1 / SIGTERM on any one rank make all ranks agree on a step,
# checkpoint it and exit 0, and so does the file DFLASH_STOP_FILE names once it exists.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"

# start_long NAME [WATCHDOG_S]: a 2-1 run with far more steps than the test waits for, in the background.
start_long() {
  write_config "$TMP/$1.toml" "$TMP/$1" 2 1 100000
  sed -i "s/^max_steps = 100000$/max_steps = 100000\nwatchdog_s = ${2:-1800}/" "$TMP/$1.toml"
  "$MPIEXEC" --oversubscribe -np 3 "$BIN" --config "$TMP/$1.toml" >"$TMP/$1.log" 2>&1 &
  RUN_PID=$!
  for _ in $(seq 1 600); do  # until a few steps have been logged (at most 60 s)
    [ -f "$TMP/$1/metrics.jsonl" ] && [ "$(step_lines "$TMP/$1/metrics.jsonl")" -ge 3 ] && return 0
    sleep 0.1
  done
  fail "$1: no progress within 60 s"; tail -20 "$TMP/$1.log"; return 1
}
# pid_of NAME ROLE: the pid from the start-up line of the first rank with that role (e.g. "target1").
pid_of() { sed -n "s/.* pid \([0-9]*\) .* role $2 .*/\1/p" "$TMP/$1.log" | head -1; }
# wait_exit SECONDS: waits for RUN_PID; sets RC (124 when it had to be killed).
wait_exit() {
  local end=$((SECONDS + $1))
  while kill -0 "$RUN_PID" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.2; done
  if kill -0 "$RUN_PID" 2>/dev/null; then kill -9 "$RUN_PID"; RC=124; else wait "$RUN_PID"; RC=$?; fi
}

# 1. kill -9 a target: everything stops, non-zero, and the launcher names the rank.
if start_long kill; then
  victim=$(pid_of kill target1)
  kill -9 "$victim"
  t0=$SECONDS
  wait_exit 60
  if [ "$RC" -eq 0 ] || [ "$RC" -eq 124 ]; then fail "kill: exit code $RC"; tail -20 "$TMP/kill.log"
  elif ! grep -qE "process rank 1 with PID [0-9]+ .*exited on signal 9" "$TMP/kill.log"; then fail "kill: the failed rank is not named"; tail -20 "$TMP/kill.log"
  else echo "ok: killed target1 (pid $victim): job exited $RC after $((SECONDS - t0)) s, naming rank 1"; fi
fi

# 1b. A rank that hangs without dying (SIGSTOP): the watchdogs of the ranks waiting on it end the job.
if start_long hang 3; then
  victim=$(pid_of hang target1)
  kill -STOP "$victim"
  t0=$SECONDS
  wait_exit 60
  kill -9 "$victim" 2>/dev/null
  if [ "$RC" -eq 0 ] || [ "$RC" -eq 124 ]; then fail "hang: exit code $RC"; tail -20 "$TMP/hang.log"
  elif ! grep -q "FATAL: watchdog: no progress for" "$TMP/hang.log"; then fail "hang: no watchdog message"; tail -20 "$TMP/hang.log"
  # The drafter waiting for target1 fires first (the other target waits on the drafter, with more patience).
  elif ! grep -m1 "FATAL: watchdog" "$TMP/hang.log" |
         grep -q "waiting for a batch from target 1 (rank 1); rank 1 is late"; then
    fail "hang: the first watchdog line does not name target 1 (rank 1)"; grep "watchdog" "$TMP/hang.log"
  else echo "ok: stopped target1: job exited $RC after $((SECONDS - t0)) s: $(grep -m1 "FATAL: watchdog" "$TMP/hang.log" | cut -c1-110)"; fi
fi

# 1c. The same stop with the automatic watchdog (30 minutes before the first measured step would be its bound
# at start-up, 120 s after): the stopped rank's heartbeats cease and its watcher names it within 60 s.
if start_long silent -1; then
  victim=$(pid_of silent target1)
  kill -STOP "$victim"
  t0=$SECONDS
  wait_exit 75
  took=$((SECONDS - t0))
  kill -9 "$victim" 2>/dev/null
  if [ "$RC" -eq 0 ] || [ "$RC" -eq 124 ]; then fail "silent: exit code $RC after $took s"; tail -20 "$TMP/silent.log"
  elif ! grep -q "FATAL: rank 1=target1 on host .* sent no heartbeat for 30 s" "$TMP/silent.log"; then
    fail "silent: no heartbeat message naming rank 1=target1"; grep FATAL "$TMP/silent.log"; tail -5 "$TMP/silent.log"
  elif [ "$took" -gt 60 ]; then fail "silent: the job took $took s to end (> 60)"
  else echo "ok: stopped target1 under the automatic watchdog: job exited $RC after $took s: $(grep -m1 "sent no heartbeat" "$TMP/silent.log" | cut -c1-110)"; fi
fi

# 2. An error on one rank (a resume path that does not exist) aborts every rank with a message naming it.
write_config "$TMP/err.toml" "$TMP/err" 2 1 10 '' 
sed -i 's/^keep_last = 2$/keep_last = 2\nresume = "no\/such\/step.h5"/' "$TMP/err.toml"
run_mpi 3 "$TMP/err.log" --config "$TMP/err.toml"
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then fail "error: exit code $rc"; tail -20 "$TMP/err.log"
elif ! grep -q "\[rank 2 .*FATAL: .*no/such/step.h5" "$TMP/err.log"; then fail "error: no FATAL line naming rank 2"; tail -20 "$TMP/err.log"
else echo "ok: an error on rank 2 ended the job (exit $rc): $(grep FATAL "$TMP/err.log" | head -1 | cut -c1-120)"; fi

# 3. SIGUSR1 to one target only / SIGTERM to the drafter / the file DFLASH_STOP_FILE names coming into being
# (the SLURM batch scripts' stop): agreed step, checkpoint, exit 0.
export DFLASH_STOP_FILE="$TMP/stop.flag"
for case in "usr1 USR1 target0" "term TERM drafter0" "stopfile FILE any"; do
  set -- $case
  if start_long "$1"; then
    if [ "$2" = FILE ]; then : >"$DFLASH_STOP_FILE"; else kill -"$2" "$(pid_of "$1" "$3")"; fi
    wait_exit 60
    latest=$(cat "$TMP/$1/checkpoints/latest" 2>/dev/null)
    if [ "$RC" -ne 0 ]; then fail "$1: exit code $RC"; tail -20 "$TMP/$1.log"
    elif ! grep -q "stop requested (signal or stop file on some rank): checkpointed step" "$TMP/$1.log"; then fail "$1: no stop line"; tail "$TMP/$1.log"
    elif [ -z "$latest" ] || [ ! -f "$TMP/$1/checkpoints/$latest" ]; then fail "$1: no checkpoint"
    else echo "ok: $1 ($2 to $3): exit 0 with checkpoint $latest"; fi
  fi
done
unset DFLASH_STOP_FILE
echo "$fails failed"
[ "$fails" -eq 0 ]
