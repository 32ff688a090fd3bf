#!/usr/bin/env bash
# A host dies mid-run: every rank of h2 is killed at once. Every rank of h1 must exit non-zero within 60 s,
# the job's output must name the lost host and each of its ranks with its role, and the last checkpoint
# written before the loss must still load (export reads it).
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/multihost/netns_hosts.sh"

"$BIN" topo rankfile --host "h1=$TMP/sysfs" --host "h2=$TMP/sysfs" --targets 2 --drafters 2 --out "$TMP/rf" \
  >/dev/null 2>&1 || { fail "topo rankfile"; exit 1; }
tiny_config "$TMP/long.toml" "$TMP/long" "$TMP/tokens.h5" 2 2 100000
sed -i 's/^interval = 1000$/interval = 2/' "$TMP/long.toml"
mh_mpirun -np 4 --rankfile "$TMP/rf" "$BIN" --config "$TMP/long.toml" >"$TMP/long.log" 2>&1 &
RUN_PID=$!
for _ in $(seq 1 600); do  # until a checkpoint exists and training is past it (at most 120 s)
  [ -f "$TMP/long/metrics.jsonl" ] && [ "$(wc -l <"$TMP/long/metrics.jsonl")" -ge 5 ] && break
  sleep 0.2
done
[ "$(wc -l <"$TMP/long/metrics.jsonl" 2>/dev/null)" -ge 5 ] ||
  { fail "no progress within 120 s"; tail -20 "$TMP/long.log"; exit 1; }
# pids_on HOST: the rank pids of HOST from their start-up lines.
pids_on() { sed -n "s/^\[rank [0-9]* $1\] pid \([0-9]*\) host $1 .*/\1/p" "$TMP/long.log"; }
victims=$(pids_on h2) survivors=$(pids_on h1)
[ "$(echo $victims | wc -w)" -eq 2 ] && [ "$(echo $survivors | wc -w)" -eq 2 ] ||
  { fail "expected 2 start-up lines per host: h2 [$victims] h1 [$survivors]"; exit 1; }
kill -9 $victims
t0=$SECONDS
while [ $((SECONDS - t0)) -lt 60 ]; do
  alive=0
  for p in $survivors; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive -eq 0 ] && ! kill -0 "$RUN_PID" 2>/dev/null && break
  sleep 0.2
done
took=$((SECONDS - t0))
for p in $survivors; do kill -0 "$p" 2>/dev/null && fail "rank pid $p on h1 still running $took s after h2 died"; done
if kill -0 "$RUN_PID" 2>/dev/null; then
  fail "mpirun still running $took s after h2 died"; kill -9 "$RUN_PID"
else
  wait "$RUN_PID"; rc=$?
  [ $rc -ne 0 ] || fail "mpirun exited 0 after losing h2"
fi
msg=$(grep -m1 "FATAL: lost host h2: ranks 2=target1 3=drafter1 (all 2 of its ranks)" "$TMP/long.log")
[ -n "$msg" ] || { fail "no message naming host h2 and ranks 2=target1 3=drafter1"; tail -20 "$TMP/long.log"; }
[ $fails -eq 0 ] && echo "ok: h2 killed: h1's ranks gone after $took s, mpirun exit $rc: ${msg:0:100}..."

# The checkpoint the run last completed still loads: export reads the latest one.
latest=$(cat "$TMP/long/checkpoints/latest" 2>/dev/null)
if [ -n "$latest" ] && "$BIN" export --config "$TMP/long.toml" --out "$TMP/export" >"$TMP/export.log" 2>&1 &&
   [ -s "$TMP/export/model.safetensors" ]; then
  echo "ok: the last checkpoint ($latest) loads and exports"
else
  fail "last checkpoint '$latest' does not load"; cat "$TMP/export.log"
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
