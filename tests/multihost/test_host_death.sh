#!/usr/bin/env bash
# A host dies mid-run: every rank of one host is killed at once, first h2 (a target and drafter 1), then h1
# (rank 0, and drafter 0, which writes the checkpoints). Every rank of the other host must exit non-zero
# within 60 s, the job's output must name the lost host and each of its ranks with its role, and the last
# checkpoint written before the loss must still load (export reads it).
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/multihost/netns_hosts.sh"

"$BIN" topo rankfile --host "h1=$TMP/sysfs" --host "h2=$TMP/sysfs" --targets 2 --drafters 2 --out "$TMP/rf" \
  >/dev/null 2>&1 || { fail "topo rankfile"; exit 1; }

# kill_host NAME DEAD ALIVE LOST: a long run in $TMP/NAME; DEAD's ranks are killed; LOST is what the message
# must say about them.
kill_host() {
  local name=$1 dead=$2 alive=$3 lost=$4 log=$TMP/$1.log
  tiny_config "$TMP/$name.toml" "$TMP/$name" "$TMP/tokens.h5" 2 2 100000
  sed -i 's/^interval = 1000$/interval = 2/' "$TMP/$name.toml"
  mh_mpirun -np 4 --rankfile "$TMP/rf" "$BIN" --config "$TMP/$name.toml" >"$log" 2>&1 &
  local run_pid=$! before=$fails
  for _ in $(seq 1 600); do  # until checkpoints exist and training is past them (at most 120 s)
    [ -f "$TMP/$name/metrics.jsonl" ] && [ "$(step_lines "$TMP/$name/metrics.jsonl")" -ge 5 ] && break
    sleep 0.2
  done
  [ "$(step_lines "$TMP/$name/metrics.jsonl" 2>/dev/null)" -ge 5 ] ||
    { fail "$name: no progress within 120 s"; tail -20 "$log"; kill -9 $run_pid; return; }
  # The rank pids of a host from their start-up lines.
  local victims survivors
  victims=$(sed -n "s/^\[rank [0-9]* $dead\] pid \([0-9]*\) host $dead .*/\1/p" "$log")
  survivors=$(sed -n "s/^\[rank [0-9]* $alive\] pid \([0-9]*\) host $alive .*/\1/p" "$log")
  [ "$(echo $victims | wc -w)" -eq 2 ] && [ "$(echo $survivors | wc -w)" -eq 2 ] ||
    { fail "$name: want 2 start-up lines per host: $dead [$victims] $alive [$survivors]"; kill -9 $run_pid; return; }
  kill -9 $victims
  local t0=$SECONDS alive_n p rc=0
  while [ $((SECONDS - t0)) -lt 60 ]; do
    alive_n=0
    for p in $survivors; do kill -0 "$p" 2>/dev/null && alive_n=1; done
    [ $alive_n -eq 0 ] && ! kill -0 "$run_pid" 2>/dev/null && break
    sleep 0.2
  done
  local took=$((SECONDS - t0))
  for p in $survivors; do kill -0 "$p" 2>/dev/null && fail "$name: rank pid $p on $alive alive after $took s"; done
  if kill -0 "$run_pid" 2>/dev/null; then
    fail "$name: mpirun still running $took s after $dead died"; kill -9 "$run_pid"
  else
    wait "$run_pid"; rc=$?
    [ $rc -ne 0 ] || fail "$name: mpirun exited 0 after losing $dead"
  fi
  local msg
  msg=$(grep -m1 "FATAL: lost host $dead: ranks $lost (all 2 of its ranks)" "$log")
  [ -n "$msg" ] || { fail "$name: no message naming host $dead and ranks $lost"; tail -20 "$log"; }
  [ $fails -eq $before ] && echo "ok: $dead killed: $alive's ranks gone after $took s, mpirun exit $rc: ${msg:0:90}..."
  # The checkpoint the run last completed still loads: export reads the latest one.
  local latest
  latest=$(cat "$TMP/$name/checkpoints/latest" 2>/dev/null)
  if [ -n "$latest" ] && "$BIN" export --config "$TMP/$name.toml" --out "$TMP/$name.hf" >"$TMP/$name.export" 2>&1 &&
     [ -s "$TMP/$name.hf/model.safetensors" ]; then
    echo "ok: $name: the last checkpoint ($latest) loads and exports"
  else
    fail "$name: last checkpoint '$latest' does not load"; cat "$TMP/$name.export"
  fi
}
kill_host h2dies h2 h1 "2=target1 3=drafter1"
kill_host h1dies h1 h2 "0=target0 1=drafter0"
echo "$fails failed"
[ "$fails" -eq 0 ]
