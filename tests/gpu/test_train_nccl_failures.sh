#!/usr/bin/env bash
# Failures over NCCL end the whole job within the bound, naming the rank, and leave no rank behind in an NCCL
# call: CUDA 2 targets + 1 drafter with pipeline.transport "nccl" (one GPU per rank, or the shared-GPU test mode
# of tests/gpu/nccl_common.sh) and run.watchdog_s = 5, so a target's NCCL send gives up at 7.5 s and its
# watchdog at 10 s. The target is the tiny one widened to hidden 2048 and the batches hold 4096 tokens, so each
# payload (2 taps x 2048 x 2 B x 4096 = 32 MiB) is more than NCCL's buffers (1 MiB here) and the loopback
# socket's can take without a posted receive: a send to a drafter that stopped receiving stays inside ncclSend.
# Cases: a target killed (SIGKILL); a target stopped (SIGSTOP: the drafter waiting for its batch names it); the
# drafter stopped (the targets' sends sit posted in ncclSend; the send's own bound names the drafter and aborts
# the communicator); the drafter killed while the targets are in that state. After each, no process remains.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"
source "$SRC/tests/gpu/nccl_common.sh"
export NCCL_BUFFSIZE=1048576 NCCL_P2P_NET_CHUNKSIZE=131072  # small NCCL buffers: a 32 MiB send cannot hide in them
python3 - "$SRC/configs/tiny-target.json" "$TMP/wide-target.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["hidden_size"] = 2048
json.dump(c, open(sys.argv[2], "w"))
PY
"$BIN" data synth --out "$TMP/long.h5" --vocab 255 --sequences 8000 --min-len 24 --max-len 96 --seed 4 >/dev/null ||
  { echo "FAIL: data synth"; exit 1; }

# start_long NAME: a 2-1 CUDA run over NCCL with far more steps than the test waits for, in the background.
start_long() {
  cuda_config "$TMP/$1.toml" "$TMP/$1" 2 1 100000 "${NCCL_TOML[@]}"
  sed -i -e "s/^max_steps = 100000$/max_steps = 100000\nwatchdog_s = 5/" -e 's/^token_budget = 256$/token_budget = 4096/' \
    -e "s|^random_config = .*|random_config = \"$TMP/wide-target.json\"|" -e "s|^train = .*|train = [\"$TMP/long.h5\"]|" \
    "$TMP/$1.toml"
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

# stop_case NAME ROLE PATTERN LABEL: SIGSTOP the rank of ROLE mid-run; the job must end naming it (PATTERN).
stop_case() {
  start_long "$1" || return
  local victim
  victim=$(pid_of "$1" "$2")
  kill -STOP "$victim"
  wait_exit 60
  kill -9 "$victim" 2>/dev/null
  check "$1" "$3" "$4"
}

# 2. SIGSTOP a target: the drafter waiting for its batch names it.
stop_case hang target1 "FATAL: .*target 1 \(rank 1\)" "stopped target1"

# 3. SIGSTOP the drafter: the targets' posted payloads wait in ncclSend for a receive that never comes.
stop_case dstop drafter0 \
  "FATAL: .*NCCL feature payload send of batch [0-9]+ on the world communicator .*send to drafter 0 \(world rank 2\).*not finished after.*the communicator was aborted" \
  "stopped drafter0, the target's ncclSend gave up"

# 4. The drafter dies while the targets sit in ncclSend (stopped first, so their sends are posted and unmatched).
if start_long dkill; then
  victim=$(pid_of dkill drafter0)
  kill -STOP "$victim"
  sleep 2  # the targets' next sends are posted by now, and their bound (7.5 s) is far off
  kill -9 "$victim"
  wait_exit 60
  check dkill "process rank 2 with PID [0-9]+ .*exited on signal 9" "drafter0 killed with sends pending"
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
