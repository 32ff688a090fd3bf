#!/usr/bin/env bash
# Role rebalancing (pipeline.rebalance, issue 26) on CPU ranks: 4 ranks start 2-2 with slowed targets and end
# 3-1 by themselves, training exactly what a run stopped at the move's step and resumed 3-1 by hand trains; a
# rank killed during the move ends the job naming it and the move's checkpoint resumes; "advise" only
# advises; a pinned rank is never moved (the record says why).
#
# Why the decision cannot flake: pipeline.test_target_delay_s = 0.5 makes every target sleep 0.5 s per batch
# inside its measured busy time, so a target's rate is at most 2 batches/s on any machine. 3-1 beats 2-2 by more
# than the 10 % margin as soon as the drafter's rate exceeds 2.2x the target's (4.4 batches/s, i.e. under
# 227 ms of busy time per 256-token micro-batch of this 1-layer drafter; it takes ~10 ms on the 2-core CI
# machine), and from 3-1 nothing beats 3-1 while the drafter is over 3x faster. The steps are fixed by the
# config (warm-up 1, window 3, dwell 4: decided after step 4, moved after step 5), not by timing.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"
# REBALANCE_ON_GPU=1 (tests/gpu/test_train_rebalance_nccl.sh): the same cases on CUDA ranks over NCCL, started
# as tests/gpu/nccl_common.sh starts them (on one GPU, its shared-GPU test mode): the move then also tears down
# and rebuilds both NCCL communicators.
DEVICE_TOML=()
if [ -n "${REBALANCE_ON_GPU:-}" ]; then
  source "$SRC/tests/gpu/nccl_common.sh"
  DEVICE_TOML=('transport = "nccl"')
  run_ranks() { run_nccl "$@"; }
else
  run_ranks() { run_mpi "$@"; }
  nccl_prefix() { :; }
fi

# rebalance_config FILE RUN_DIR TARGETS DRAFTERS GRAD_ACCUM [extra [pipeline] lines...]: 14 steps of the tiny run.
rebalance_config() {
  local f=$1 dir=$2 t=$3 d=$4 ga=$5
  shift 5
  write_config "$f" "$dir" "$t" "$d" 14 "[pipeline]" "rebalance_warmup_steps = 1" "rebalance_window_steps = 3" \
    "rebalance_dwell_steps = 4" "${DEVICE_TOML[@]}" "$@"
  sed -i "s/^grad_accum = 2$/grad_accum = $ga/" "$f"
  if [ -n "${REBALANCE_ON_GPU:-}" ]; then sed -i 's/^device = "cpu"$/device = "cuda"/' "$f"; fi
}
# events FILE KIND: "step from to" of every record of that event kind in a metrics.jsonl.
events() {
  python3 -c 'import json,sys
for j in map(json.loads, open(sys.argv[1])):
    if j.get("event") == sys.argv[2]:
        print(j["step"], j["from"], j["to"], j.get("reason", ""))' "$1" "$2"
}
SLOW='test_target_delay_s = 0.5'
# On CUDA ranks sharing one GPU over NCCL sockets, the drafter's measured rate fell to ~4 batches/s (busy time
# includes waiting for the GPU the other ranks' spinning NCCL kernels hold), too close to 2.2 x 1.8: there the
# targets sleep 2 s, capping them at 0.5 batches/s, and 3-1 beats 2-2 by 50 % whenever the drafter is over
# 1.5 batches/s.
if [ -n "${REBALANCE_ON_GPU:-}" ]; then SLOW='test_target_delay_s = 2.0'; fi
# Checks read captured output (grep <<<"$(...)"), never `python3 ... | grep -q`: with pipefail and an unbuffered
# python (PYTHONUNBUFFERED=1), grep leaving at the first match would fail the writer with SIGPIPE now and then.

# 1. 2-2 with slowed targets under "auto" moves to 3-1 once, by itself, and finishes.
rebalance_config "$TMP/auto.toml" "$TMP/auto" 2 2 1 'rebalance = "auto"' "$SLOW"
move=""
if ! run_ranks 4 "$TMP/auto.log" --config "$TMP/auto.toml"; then
  fail "auto: the run exited non-zero"; tail -30 "$TMP/auto.log"
else
  moves=$(events "$TMP/auto/metrics.jsonl" rebalance)
  move=$(echo "$moves" | awk 'NR == 1 {print $1}')
  starts "$TMP/auto/metrics.jsonl" >"$TMP/auto.starts"
  id=$(sed -n '1s/.*run_id=//p' "$TMP/auto.starts")
  if [ "$(echo "$moves" | wc -l)" -ne 1 ] || ! grep -q "^5 2-2 3-1" <<<"$moves"; then
    fail "auto: expected one move 2-2 -> 3-1 after step 5, got: $moves"; grep "rebalance" "$TMP/auto.log"
  elif [ "$(wc -l <"$TMP/auto.starts")" -ne 2 ] ||
       ! grep -q "^step=5 resumed_from=$TMP/auto/checkpoints/step_00000005.h5 run_id=$id$" "$TMP/auto.starts"; then
    fail "auto: the re-formed run did not resume the move's checkpoint in the same lineage"; cat "$TMP/auto.starts"
  elif ! grep -q "plan: 3 targets, 1 drafter, grad_accum 2 -> 2 batches per step; steps 5..14" "$TMP/auto.log" ||
       ! grep -q "\[rank 3 .*re-formed: role target2" "$TMP/auto.log"; then
    fail "auto: no 3-1 plan with grad_accum 2 / rank 3 did not become target 2"; grep "plan:\|re-formed" "$TMP/auto.log"
  elif [ ! -f "$TMP/auto/checkpoints/step_00000005.h5" ] || [ ! -f "$TMP/auto/checkpoints/step_00000014.h5" ] ||
       [ "$(step_lines "$TMP/auto/metrics.jsonl")" -ne 14 ]; then
    fail "auto: a checkpoint or a metrics line is missing"; ls "$TMP/auto/checkpoints"
  else
    echo "ok: 2-2 moved to 3-1 by itself: $(grep -m1 "rebalance: moving" "$TMP/auto.log" | sed 's/^\[[^]]*\] //' | cut -c1-150)"
  fi
fi

# 2. The same run by hand: 2-2 stopped after the move's step, resumed 3-1 with grad_accum 2 (the global batch of
# 2 micro-batches kept). Both resume the same checkpoint into the same 3-1 pass, so rtol 1e-6 is a formality:
# the losses are expected bit-identical (printed).
if [ -n "$move" ]; then
  rebalance_config "$TMP/hand.toml" "$TMP/hand" 2 2 1 'rebalance = "off"'
  rebalance_config "$TMP/hand31.toml" "$TMP/hand" 3 1 2 'rebalance = "off"'
  if run_ranks 4 "$TMP/hand.log" --config "$TMP/hand.toml" --stop-at-step "$move" &&
     run_ranks 4 "$TMP/hand31.log" --config "$TMP/hand31.toml"; then
    python3 "$SRC/tests/mpi/compare_losses.py" "$TMP/auto/metrics.jsonl" "$TMP/hand/metrics.jsonl" 1e-6 0 \
      "moved by itself vs stopped after step $move and resumed 3-1 by hand" || fail "auto vs by hand: losses differ"
    paste <(losses "$TMP/auto/metrics.jsonl") <(losses "$TMP/hand/metrics.jsonl") |
      awk '$1 != $2 {d++} END {print (d ? d " steps differ in some bit" : "bit-identical losses over all " NR " steps")}'
  else
    fail "by hand: the 2-2 or the 3-1 run failed"; tail -20 "$TMP/hand.log" "$TMP/hand31.log"
  fi
fi

# 3. A rank killed during the move (DFLASH_TEST_KILL_AT_REFORM=3: rank 3 kills itself after the checkpoint,
# before the re-form) ends the job naming it; the same command then resumes the move's checkpoint and finishes.
rebalance_config "$TMP/kill.toml" "$TMP/kill" 2 2 1 'rebalance = "auto"' "$SLOW"
# shellcheck disable=SC2046
DFLASH_TEST_KILL_AT_REFORM=3 timeout 300 "$MPIEXEC" --oversubscribe -np 4 -x DFLASH_TEST_KILL_AT_REFORM $(nccl_prefix 4) "$BIN" \
  --config "$TMP/kill.toml" >"$TMP/kill.log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then fail "kill: exit code $rc"; tail -20 "$TMP/kill.log"
elif ! grep -qE "process rank 3 with PID [0-9]+ .*exited on signal 9" "$TMP/kill.log"; then
  fail "kill: the killed rank is not named"; tail -20 "$TMP/kill.log"
elif [ "$(cat "$TMP/kill/checkpoints/latest" 2>/dev/null)" != "step_00000005.h5" ]; then
  fail "kill: the move's checkpoint is not the latest"; ls "$TMP/kill/checkpoints"
elif ! run_ranks 4 "$TMP/kill2.log" --config "$TMP/kill.toml"; then
  fail "kill: the resume after the kill failed"; tail -20 "$TMP/kill2.log"
elif ! grep -q "^step=5 resumed_from=$TMP/kill/checkpoints/step_00000005.h5 " <<<"$(starts "$TMP/kill/metrics.jsonl")"; then
  fail "kill: the rerun did not resume step 5"; starts "$TMP/kill/metrics.jsonl"
else
  # The rerun starts 2-2 again at step 5 and moves after its own dwell: same batches, same global batch, so
  # the losses follow the uninterrupted run within the fp32 order of the gradient sums (test_train_splits.sh).
  python3 "$SRC/tests/mpi/compare_losses.py" <(python3 -c 'import json,sys
rows = {}
for j in map(json.loads, open(sys.argv[1])):
    if "loss" in j: rows[j["step"]] = j
for s in sorted(rows): print(json.dumps(rows[s]))' "$TMP/kill/metrics.jsonl") "$TMP/auto/metrics.jsonl" 1e-6 0 \
    "killed during the move and resumed vs uninterrupted" || fail "kill: the resumed run's losses differ"
  echo "ok: rank 3 killed during the move: exit $rc, $(grep -m1 -oE "process rank 3 with PID [0-9]+ .*signal 9" "$TMP/kill.log"); resumed step 5"
fi

# 4. "advise" reports 3-1 and moves nothing; "auto" with rank 3 pinned (by pipeline.rebalance_pinned, and by
# `pinned` in a rankfile) records the refusal and moves nothing.
rebalance_config "$TMP/adv.toml" "$TMP/adv" 2 2 1 'rebalance = "advise"' "$SLOW"
rebalance_config "$TMP/pin.toml" "$TMP/pin" 2 2 1 'rebalance = "auto"' 'rebalance_pinned = [3]' "$SLOW"
rebalance_config "$TMP/pinrf.toml" "$TMP/pinrf" 2 2 1 'rebalance = "auto"' "$SLOW"
host=$(hostname)
printf 'rank 0=%s slot=0  # role=target\nrank 1=%s slot=0  # role=target\nrank 2=%s slot=0  # role=drafter\nrank 3=%s slot=0  # role=drafter pinned\n' \
  "$host" "$host" "$host" "$host" >"$TMP/pin.rf"
if run_ranks 4 "$TMP/adv.log" --config "$TMP/adv.toml" && run_ranks 4 "$TMP/pin.log" --config "$TMP/pin.toml" &&
   run_ranks 4 "$TMP/pinrf.log" --config "$TMP/pinrf.toml" --rankfile "$TMP/pin.rf"; then
  if ! grep -q "^4 2-2 3-1" <<<"$(events "$TMP/adv/metrics.jsonl" rebalance_advice)" ||
     [ -n "$(events "$TMP/adv/metrics.jsonl" rebalance)" ] || [ "$(starts "$TMP/adv/metrics.jsonl" | wc -l)" -ne 1 ]; then
    fail "advise: expected advice 2-2 -> 3-1 after step 4 and no move"; grep event "$TMP/adv/metrics.jsonl"
  elif ! grep -q "^4 2-2 3-1 pinned ranks" <<<"$(events "$TMP/pin/metrics.jsonl" rebalance_refused)" ||
       [ -n "$(events "$TMP/pin/metrics.jsonl" rebalance)" ]; then
    fail "pinned: expected a refusal naming the pins and no move"; grep event "$TMP/pin/metrics.jsonl"
  elif ! grep -q "^4 2-2 3-1 pinned ranks" <<<"$(events "$TMP/pinrf/metrics.jsonl" rebalance_refused)" ||
       [ -n "$(events "$TMP/pinrf/metrics.jsonl" rebalance)" ]; then
    fail "rankfile pinned: expected a refusal naming the pins and no move"; grep event "$TMP/pinrf/metrics.jsonl"
  else
    echo "ok: advise: $(grep -m1 -o "rebalance advice: .*" "$TMP/adv.log" | cut -c1-90)"
    echo "ok: pinned: $(grep -m1 -o "rebalance: 3-1 refused: .*" "$TMP/pin.log" | cut -c1-120)"
  fi
else
  fail "advise / pinned runs"; tail -20 "$TMP/adv.log" "$TMP/pin.log" "$TMP/pinrf.log"
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
