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
# The checkpoint is the truth: export writes the drafter it trained (mask id 255), not what the TOML says now.
sed 's/^mask_token_id = 255$/mask_token_id = 7/' "$TMP/straight.toml" >"$TMP/mask7.toml"
if "$BIN" export --config "$TMP/mask7.toml" --out "$TMP/export7" >"$TMP/export7.log" 2>&1 &&
   python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["dflash_config"]["mask_token_id"] != 255)' \
     "$TMP/export7/config.json" &&
   grep -q "drafter.mask_token_id = 7 but .* was trained with 255" "$TMP/export7.log"; then
  echo "ok: export takes the mask id from the checkpoint and says the TOML disagrees"
else
  fail "export with a disagreeing mask id"; cat "$TMP/export7.log"; cat "$TMP/export7/config.json"
fi
# A resume that changes what was trained (here the LR) is refused naming the key, unless allowed by name.
# A run dir whose newest checkpoint is step 10 (a resume of an older step, with step 20 there, is refused
# before any config is compared: test_run_safety.sh).
mkdir -p "$TMP/lr/checkpoints"
cp "$TMP/fewer/checkpoints/step_00000010.h5" "$TMP/lr/checkpoints/"
echo "step_00000010.h5" >"$TMP/lr/checkpoints/latest"
write_config "$TMP/lr.toml" "$TMP/lr" 1 1 20
sed -i 's/^lr = 3e-3$/lr = 1e-3/' "$TMP/lr.toml"
run_mpi 2 "$TMP/lr.log" --config "$TMP/lr.toml" && fail "a resume with another train.lr was accepted"
grep -q "'train.lr' is 0.001 but .*step_00000010.h5 was trained with 0.003" "$TMP/lr.log" ||
  { fail "no message naming train.lr"; tail "$TMP/lr.log"; }
run_mpi 2 "$TMP/lr2.log" --config "$TMP/lr.toml" --allow-change train.lr ||
  { fail "--allow-change train.lr was not accepted"; tail "$TMP/lr2.log"; }
grep -q "resumed from .*step_00000010.h5 at step 10" "$TMP/lr2.log" && echo "ok: train.lr change refused, then allowed"
echo "$fails failed"
[ "$fails" -eq 0 ]
