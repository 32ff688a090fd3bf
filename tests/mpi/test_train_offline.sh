#!/usr/bin/env bash
# Offline training from stored features: `extract --for-config` writes exactly the taps the run needs, and a run
# with data.features and no target ranks trains on 1 and on 2 drafters with the losses of the same run fed by a
# live target rank (the taps are the same bf16 values; only the target forward's batching differs, which moves
# fp32 hidden states in the last bits before the bf16 rounding, so losses agree to 1e-3 relative, not bit for
# bit). Features that lack a tap, or do not belong to data.train, are refused naming the file.
# Args: binary, source dir, mpiexec.
BIN="$1"
SRC="$2"
MPIEXEC="$3"
source "$SRC/tests/mpi/train_common.sh"

"$BIN" model init --hf-config "$SRC/configs/tiny-target.json" --out "$TMP/target" >/dev/null || { echo "FAIL: model init"; exit 1; }
# online: 1 target + 1 drafter; offline: 0 targets, the same data as features.
write_config "$TMP/online.toml" "$TMP/run_on" 1 1 6
sed -i "s|^random_config = .*|model = \"$TMP/target\"|" "$TMP/online.toml"
run_mpi 2 "$TMP/on.log" --config "$TMP/online.toml" || { fail "online run: $(tail -5 "$TMP/on.log")"; }

"$BIN" extract --model "$TMP/target" --tokens "$TMP/tokens.h5" --out "$TMP/feat.h5" --for-config "$TMP/online.toml" \
  >"$TMP/extract.log" 2>&1 || { echo "FAIL: extract: $(tail -3 "$TMP/extract.log")"; exit 1; }
offline_config() {  # FILE RUN_DIR DRAFTERS
  write_config "$1" "$2" 0 "$3" 6
  sed -i -e "s|^random_config = .*|model = \"$TMP/target\"|" -e "s|^train = .*|features = [\"$TMP/feat.h5\"]|" "$1"
}
offline_config "$TMP/off1.toml" "$TMP/run_off1" 1
run_mpi 1 "$TMP/off1.log" --config "$TMP/off1.toml" || fail "offline run, 1 drafter: $(tail -5 "$TMP/off1.log")"
grep -q "roles from data.features" "$TMP/off1.log" || fail "offline run did not say where its roles came from"
grep -q "offline features: read at" "$TMP/off1.log" || fail "no feature-read throughput line"

python3 - "$TMP/run_on/metrics.jsonl" "$TMP/run_off1/metrics.jsonl" <<'PY' || fail "offline losses differ from online"
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l]
b = [json.loads(l)["loss"] for l in open(sys.argv[2]) if '"loss"' in l]
assert len(a) == len(b) == 6, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"online vs offline losses over {len(a)} steps: worst relative difference {worst:.2e}")
sys.exit(0 if worst < 1e-3 else 1)
PY

# Two drafters, each reading its own batches (grad_accum 2 x 2 drafters): trains and finishes.
offline_config "$TMP/off2.toml" "$TMP/run_off2" 2
run_mpi 2 "$TMP/off2.log" --config "$TMP/off2.toml" || fail "offline run, 2 drafters: $(tail -5 "$TMP/off2.log")"
[ "$(grep -c '"loss"' "$TMP/run_off2/metrics.jsonl" 2>/dev/null)" = 6 ] || fail "2-drafter offline run logged no 6 steps"

# Refusals: a drafter wanting tap 2 (the file has 1 and 3); data.train that is another token file.
offline_config "$TMP/bad.toml" "$TMP/run_bad" 1
sed -i "s|^target_layer_ids = .*|target_layer_ids = [1, 2]|" "$TMP/bad.toml"
run_mpi 1 "$TMP/bad.log" --config "$TMP/bad.toml" && fail "features without a needed tap were accepted"
grep -q "feat.h5: holds no tap of layer 2" "$TMP/bad.log" || fail "missing-tap error unclear: $(grep -i error "$TMP/bad.log" | head -2)"
"$BIN" data synth --out "$TMP/other.h5" --vocab 255 --sequences 40 --min-len 24 --max-len 96 --seed 9 >/dev/null
offline_config "$TMP/bad2.toml" "$TMP/run_bad2" 1
sed -i "s|^\[data\]|[data]\ntrain = [\"$TMP/other.h5\"]|" "$TMP/bad2.toml"
run_mpi 1 "$TMP/bad2.log" --config "$TMP/bad2.toml" && fail "features of other tokens were accepted"
grep -q "its tokens are not those of data.train\[0\]" "$TMP/bad2.log" || fail "token mismatch error unclear: $(grep -i error "$TMP/bad2.log" | head -2)"

[ $fails -eq 0 ] && echo "offline training: all checks passed"
exit $((fails > 0))
