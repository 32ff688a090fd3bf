#!/usr/bin/env bash
# Resume continues bit-identically: 20 steps straight vs 10 (--stop-at-step) + resume + 10 give identical losses, and a resume
# with a different number of target ranks continues the same run.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"
write_config "$TMP/straight.toml" "$TMP/straight" 2 1 20
run_mpi 3 "$TMP/straight.log" --config "$TMP/straight.toml" || { fail "straight run"; tail -20 "$TMP/straight.log"; }
# The trained drafter exports as a Hugging Face DFlash model.
if "$BIN" export --config "$TMP/straight.toml" --out "$TMP/export" >"$TMP/export.log" 2>&1 &&
   grep -q '"DFlashDraftModel"' "$TMP/export/config.json" && [ -s "$TMP/export/model.safetensors" ]; then
  echo "ok: export of step 20 -> config.json + model.safetensors"
else
  fail "export"; cat "$TMP/export.log"
fi
write_config "$TMP/split.toml" "$TMP/split" 2 1 20
run_mpi 3 "$TMP/half1.log" --config "$TMP/split.toml" --stop-at-step 10 || { fail "first half"; tail -20 "$TMP/half1.log"; }
run_mpi 3 "$TMP/half2.log" --config "$TMP/split.toml" || { fail "second half"; tail -20 "$TMP/half2.log"; }
grep -q "resumed from .*step_00000010.h5 at step 10" "$TMP/half2.log" || fail "second half did not resume at step 10"
# Each segment starts with a marker; the resumed one names its checkpoint and keeps the lineage id.
mapfile -t marks < <(starts "$TMP/split/metrics.jsonl")
if [ "${#marks[@]}" -eq 2 ] && [[ ${marks[0]} == "step=0 resumed_from= run_id="?* ]] &&
   [[ ${marks[1]} == "step=10 resumed_from=$TMP/split/checkpoints/step_00000010.h5 run_id=${marks[0]##*run_id=}" ]]
then
  echo "ok: start markers: ${marks[*]}"
else
  fail "start markers in metrics.jsonl: ${marks[*]}"
fi
if [ "$(losses "$TMP/straight/metrics.jsonl")" == "$(losses "$TMP/split/metrics.jsonl")" ]; then
  echo "ok: 20 straight == 10 + resume + 10 ($(losses "$TMP/straight/metrics.jsonl" | tr '\n' ' '))"
else
  fail "losses differ"; paste <(losses "$TMP/straight/metrics.jsonl") <(losses "$TMP/split/metrics.jsonl")
fi
# Resume the 10-step checkpoint with one target instead of two: the global batch order is the same.
cp -r "$TMP/split" "$TMP/fewer"
rm -f "$TMP/fewer/checkpoints/step_00000020.h5" && echo "step_00000010.h5" >"$TMP/fewer/checkpoints/latest"
sed '/"step":10,/q' "$TMP/split/metrics.jsonl" >"$TMP/fewer/metrics.jsonl"
write_config "$TMP/fewer.toml" "$TMP/fewer" 1 1 20
run_mpi 2 "$TMP/fewer.log" --config "$TMP/fewer.toml" || { fail "resume with 1 target"; tail -20 "$TMP/fewer.log"; }
if [ "$(losses "$TMP/straight/metrics.jsonl")" == "$(losses "$TMP/fewer/metrics.jsonl")" ]; then
  echo "ok: resume with 1 target instead of 2 gives the same losses"
else
  fail "resume with fewer targets changed the losses"
fi
# Resuming with another drafters x grad_accum would remap batches to steps: refused, saying what to do.
cp -r "$TMP/fewer" "$TMP/more"
rm -f "$TMP/more/checkpoints/step_00000020.h5" && echo "step_00000010.h5" >"$TMP/more/checkpoints/latest"
write_config "$TMP/more.toml" "$TMP/more" 1 2 20
run_mpi 3 "$TMP/more.log" --config "$TMP/more.toml" && fail "resume with 2 drafters instead of 1 was accepted"
grep -q "HINT: resume with drafters x train.grad_accum = 2" "$TMP/more.log" || { fail "no hint for the drafter count"; tail "$TMP/more.log"; }
echo "$fails failed"
[ "$fails" -eq 0 ]
