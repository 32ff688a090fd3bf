#!/usr/bin/env bash
# Run safety end to end: a start never overwrites or rotates away checkpoints it does not continue (refused
# with the files named; --fresh-start moves them aside intact), --stop-at-step must lie after the resumed
# step, one run per run dir (a second run is refused naming the holder; a dead holder's lock is said stale).
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"
# expect_refused NAME NEEDLE args...: the run must exit non-zero with NEEDLE in a FATAL line.
expect_refused() {
  local name=$1 needle=$2
  shift 2
  if run_mpi 3 "$TMP/$name.log" "$@"; then fail "$name: was accepted"; tail -5 "$TMP/$name.log"
  elif ! grep "FATAL" "$TMP/$name.log" | grep -qF -- "$needle"; then
    fail "$name: no FATAL line with '$needle'"; tail -5 "$TMP/$name.log"
  else echo "ok: $name refused: $(grep -m1 FATAL "$TMP/$name.log" | cut -c1-150)..."; fi
}
sums() { (cd "$1" && md5sum step_*.h5 latest); }

# A 6-step run checkpointing every 2 steps and keeping 2: step_4, step_6 and latest remain.
write_config "$TMP/a.toml" "$TMP/a" 2 1 6
sed -i 's/^interval = 1000$/interval = 2/' "$TMP/a.toml"
run_mpi 3 "$TMP/a.log" --config "$TMP/a.toml" || { fail "first run"; tail -20 "$TMP/a.log"; }
C=$TMP/a/checkpoints
before=$(sums "$C")
[ "$(ls "$C" | tr '\n' ' ')" == "latest step_00000004.h5 step_00000006.h5 " ] ||
  fail "first run left $(ls "$C" | tr '\n' ' ')"

# 1. A fresh start (resume = "none"), a start without `latest`, and a resume of an older step would all
#    overwrite or rotate away the run's checkpoints: refused, nothing touched.
sed 's/^keep_last = 2$/keep_last = 2\nresume = "none"/' "$TMP/a.toml" >"$TMP/none.toml"
expect_refused none 'step_00000004.h5, step_00000006.h5, `latest`. This run starts fresh (checkpoint.resume = "none")' \
  --config "$TMP/none.toml"
mv "$C/latest" "$TMP/latest.saved"
expect_refused nolatest "step_00000004.h5, step_00000006.h5. This run starts fresh: there is no \`latest\` pointer" \
  --config "$TMP/a.toml"
mv "$TMP/latest.saved" "$C/latest"
sed "s|^keep_last = 2\$|keep_last = 2\nresume = \"$C/step_00000004.h5\"|" "$TMP/a.toml" >"$TMP/older.toml"
sed -i 's/^max_steps = 6$/max_steps = 8/' "$TMP/older.toml"
expect_refused older "step_00000006.h5. This run resumes step 4 from $C/step_00000004.h5" --config "$TMP/older.toml"
[ "$(sums "$C")" == "$before" ] || fail "a refused start changed the checkpoints"

# 2. --stop-at-step at or below the step resumed from is an error (the run would never stop there).
sed 's/^max_steps = 6$/max_steps = 10/' "$TMP/a.toml" >"$TMP/ten.toml"
expect_refused stop6 "--stop-at-step 6 is not after step 6" --config "$TMP/ten.toml" --stop-at-step 6 \
  --allow-change run.max_steps

# 3. --fresh-start moves the whole folder aside, intact, and starts at step 0 with a new lineage id.
run_mpi 3 "$TMP/fresh.log" --config "$TMP/none.toml" --fresh-start || { fail "fresh start"; tail -20 "$TMP/fresh.log"; }
old=$(ls -d "$TMP"/a/checkpoints.old-* 2>/dev/null | head -1)
mapfile -t marks < <(starts "$TMP/a/metrics.jsonl")
if [ -z "$old" ] || [ "$(sums "$old")" != "$before" ]; then
  fail "fresh start: the old checkpoints are not intact in $old"
elif [ ! -f "$C/step_00000006.h5" ]; then fail "fresh start: no new step_6"
elif [ "${#marks[@]}" -ne 2 ] || [[ ${marks[1]} != "step=0 resumed_from= run_id="* ]] ||
     [ "${marks[0]##*run_id=}" == "${marks[1]##*run_id=}" ]; then fail "fresh start markers: ${marks[*]}"
else echo "ok: --fresh-start moved the checkpoints intact to ${old##*/}; markers: ${marks[*]}"; fi

# 4. One run per run dir: a second run is refused naming the holder; after the holder is killed its lock is stale.
write_config "$TMP/long.toml" "$TMP/L" 2 1 100000
"$MPIEXEC" --oversubscribe -np 3 "$BIN" --config "$TMP/long.toml" >"$TMP/long.log" 2>&1 &
RUN_PID=$!
for _ in $(seq 1 600); do
  [ -f "$TMP/L/metrics.jsonl" ] && [ "$(step_lines "$TMP/L/metrics.jsonl")" -ge 2 ] && break
  sleep 0.1
done
holder=$(sed -n "s/.* pid \([0-9]*\) .* role drafter0 .*/\1/p" "$TMP/long.log" | head -1)
write_config "$TMP/short.toml" "$TMP/L" 2 1 2
expect_refused second "is in use by another run (host=$(hostname) pid=$holder " --config "$TMP/short.toml"
kill -9 "$holder"
wait "$RUN_PID"
stale="taking over a stale lock: host=$(hostname) pid=$holder .*process $holder on this host no longer exists"
if ! run_mpi 3 "$TMP/after.log" --config "$TMP/short.toml"; then fail "run after the holder died"; tail -20 "$TMP/after.log"
elif ! grep -q "$stale" "$TMP/after.log"; then fail "no stale-lock message"; grep -i lock "$TMP/after.log"
else echo "ok: the lock of the killed run (pid $holder) was reported stale and taken over"; fi
[ ! -s "$TMP/L/run.lock" ] || fail "a cleanly ended run left its holder in run.lock: $(cat "$TMP/L/run.lock")"
echo "$fails failed"
[ "$fails" -eq 0 ]
