#!/usr/bin/env bash
# Failures over NCCL end the whole job within the bound, naming the rank, and leave no rank behind in an NCCL
# call: CUDA 2 targets + 1 drafter with pipeline.transport "nccl" (one GPU per rank, or the shared-GPU test mode
# of tests/gpu/nccl_common.sh) and run.watchdog_s = 5, so a target's NCCL send gives up at 7.5 s and its
# watchdog at 10 s. Cases: a target killed (SIGKILL); a target stopped (SIGSTOP: the drafter waiting for its
# batch names it); the drafter stopped while the targets hold credits, so their next payloads sit posted in
# ncclSend with no receive (the send's bounded wait, or the watchdog, names the drafter, and the communicator is
# aborted); the drafter killed while the targets are in that state. After each, no process of the run remains.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"
source "$SRC/tests/gpu/nccl_common.sh"

# start_long NAME: a 2-1 CUDA run over NCCL with far more steps than the test waits for, in the background.
start_long() {
  cuda_config "$TMP/$1.toml" "$TMP/$1" 2 1 100000 "${NCCL_TOML[@]}"
  sed -i "s/^max_steps = 100000$/max_steps = 100000\nwatchdog_s = 5/" "$TMP/$1.toml"
  # shellcheck disable=SC2046
  "$MPIEXEC" --oversubscribe -np 3 $(nccl_prefix 3) "$BIN" --config "$TMP/$1.toml" >"$TMP/$1.log" 2>&1 &
  RUN_PID=$!
  for _ in $(seq 1 1200); do  # until a few steps have been logged (at most 120 s: CUDA and NCCL start-up)
    [ -f "$TMP/$1/metrics.jsonl" ] && [ "$(step_lines "$TMP/$1/metrics.jsonl")" -ge 3 ] && return 0
    kill -0 "$RUN_PID" 2>/dev/null || break
    sleep 0.1
  done
  fail "$1: no progress within 120 s"; tail -20 "$TMP/$1.log"; kill -9 "$RUN_PID" 2>/dev/null; return 1
}
pid_of() { sed -n "s/.* pid \([0-9]*\) .* role $2 .*/\1/p" "$TMP/$1.log" | head -1; }
# wait_exit SECONDS: waits for RUN_PID; sets RC (124 when it had to be killed) and TOOK.
wait_exit() {
  local t0=$SECONDS end=$((SECONDS + $1))
  while kill -0 "$RUN_PID" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.2; done
  if kill -0 "$RUN_PID" 2>/dev/null; then kill -9 "$RUN_PID"; RC=124; else wait "$RUN_PID"; RC=$?; fi
  TOOK=$((SECONDS - t0))
}
# no_leftovers NAME: no process of the run is alive (none left waiting in an NCCL call).
no_leftovers() {
  sleep 1
  local left
  left=$(pgrep -f "$TMP/$1.toml" | tr '\n' ' ')
  if [ -n "$left" ]; then fail "$1: processes left after the job ended: $left"; pkill -9 -f "$TMP/$1.toml"; fi
}
# check NAME PATTERN LABEL: non-zero exit within 60 s, PATTERN in the log, nothing left.
check() {
  if [ "$RC" -eq 0 ] || [ "$RC" -eq 124 ]; then fail "$1: exit code $RC after $TOOK s"; tail -20 "$TMP/$1.log"
  elif ! grep -qE "$2" "$TMP/$1.log"; then fail "$1: the log does not name the rank ($2)"; grep -E "FATAL|exited" "$TMP/$1.log"; tail -5 "$TMP/$1.log"
  elif [ "$TOOK" -gt 60 ]; then fail "$1: the job took $TOOK s to end (> 60)"
  else echo "ok: $3: job exited $RC after $TOOK s: $(grep -m1 -E "$2" "$TMP/$1.log" | cut -c1-160)"; fi
  no_leftovers "$1"
}

# 1. SIGKILL a target: the launcher ends the job naming the rank.
if start_long kill; then
  kill -9 "$(pid_of kill target1)"
  wait_exit 60
  check kill "process rank 1 with PID [0-9]+ .*exited on signal 9" "killed target1"
fi

# 2. SIGSTOP a target: the drafter waiting for its batch names it.
if start_long hang; then
  victim=$(pid_of hang target1)
  kill -STOP "$victim"
  wait_exit 60
  kill -9 "$victim" 2>/dev/null
  check hang "FATAL: .*target 1 \(rank 1\)" "stopped target1"
fi

# 3. SIGSTOP the drafter: the targets' posted payloads wait in ncclSend for a receive that never comes.
if start_long dstop; then
  victim=$(pid_of dstop drafter0)
  kill -STOP "$victim"
  wait_exit 60
  kill -9 "$victim" 2>/dev/null
  check dstop "FATAL: .*drafter 0 \((world )?rank 2\)" "stopped drafter0"
  grep -q "NCCL feature payload send of batch [0-9]* on the world communicator .*the communicator was aborted" \
    "$TMP/dstop.log" && echo "   (the NCCL send's own bound fired first and aborted the communicator)"
fi

# 4. The drafter dies while the targets sit in ncclSend (stopped first, so their sends are posted and unmatched).
if start_long dkill; then
  victim=$(pid_of dkill drafter0)
  kill -STOP "$victim"
  sleep 1.5
  kill -9 "$victim"
  wait_exit 60
  check dkill "process rank 2 with PID [0-9]+ .*exited on signal 9" "drafter0 killed with sends pending"
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
