#!/usr/bin/env bash
# Bad input to the real binary: each case must exit non-zero and print a message naming the problem.
# Args: <dflash_mpi binary> <source dir>
BIN=$1
SRC=$2
source "$SRC/tests/cli/cli_common.sh"

base="[target]
random_config = \"$SRC/configs/tiny-target.json\"
device = \"cpu\"
[drafter]
mask_token_id = 255
"
printf '%s\n[train]\nlearning_rate = 1e-3\n' "$base" >"$TMP/badkey.toml"
printf '%s\n[train]\nlr = "fast"\n' "$base" >"$TMP/badtype.toml"
# config check runs every check of a training run, so the good config names real data and a usable run.dir.
"$BIN" data synth --out "$TMP/good.h5" --vocab 256 --sequences 20 --min-len 16 --max-len 40 --seed 1 >/dev/null
printf '[run]\ndir = "%s"\nmax_steps = 2\n%s\n[data]\ntrain = ["%s"]\n' "$TMP/run" "$base" "$TMP/good.h5" \
  >"$TMP/good.toml"
expect_fail "unknown key 'train.learning_rate'" "$BIN" config check --config "$TMP/badkey.toml"
expect_fail "'train.lr' must be a number" "$BIN" config check --config "$TMP/badtype.toml"
expect_fail "cannot open config file '$TMP/missing.toml'" "$BIN" config check --config "$TMP/missing.toml"
"$BIN" config check --config "$TMP/good.toml" >"$TMP/good.out" 2>&1 || { echo "FAIL: good config rejected"; cat "$TMP/good.out"; fails=$((fails + 1)); }

# Unknown model_type and a missing model directory.
mkdir -p "$TMP/llama"
sed 's/"qwen3_5_text"/"llama"/' "$SRC/configs/tiny-target.json" >"$TMP/llama/config.json"
"$BIN" data synth --out "$TMP/tok.h5" --vocab 256 --sequences 4 --min-len 4 --max-len 9 --seed 1 >/dev/null
expect_fail "llama" "$BIN" extract --model "$TMP/llama" --tokens "$TMP/tok.h5" --out "$TMP/o.h5"
expect_fail "$TMP/nothing" "$BIN" extract --model "$TMP/nothing" --tokens "$TMP/tok.h5" --out "$TMP/o.h5"
expect_fail "$TMP/none.h5" "$BIN" extract --model "$TMP/llama" --tokens "$TMP/none.h5" --out "$TMP/o.h5"
# A token id outside the vocabulary names the id; a weights file that does not fit the config names the tensor.
"$BIN" model init --hf-config "$SRC/configs/tiny-target.json" --out "$TMP/tiny" >/dev/null
"$BIN" data synth --out "$TMP/big.h5" --vocab 300 --sequences 8 --min-len 50 --max-len 60 --seed 2 >/dev/null
expect_fail "outside the model's vocabulary" "$BIN" extract --model "$TMP/tiny" --tokens "$TMP/big.h5" --out "$TMP/o.h5"
sed -i 's/"intermediate_size": 128/"intermediate_size": 130/' "$TMP/tiny/config.json"
expect_fail "mlp.gate_proj.weight" "$BIN" extract --model "$TMP/tiny" --tokens "$TMP/tok.h5" --out "$TMP/o.h5"
[ ! -e "$TMP/o.h5" ] || { echo "FAIL: a failed extract left $TMP/o.h5 behind"; fails=$((fails + 1)); }
expect_fail "--layers" "$BIN" extract --model "$TMP/tiny" --tokens "$TMP/tok.h5" --out "$TMP/o.h5" --layers 1,99

# Offline features: --for-config writes exactly the drafter's taps (configs/tiny.toml: layers 1 and 3, CE loss),
# bf16 by default, with the tokens; --dtype f32 and --layers lists are honoured.
"$BIN" model init --hf-config "$SRC/configs/tiny-target.json" --out "$TMP/tiny2" >/dev/null
if "$BIN" extract --model "$TMP/tiny2" --tokens "$TMP/tok.h5" --out "$TMP/feat.h5" \
     --for-config "$SRC/configs/tiny.toml" >"$TMP/x.log" 2>&1; then
  sets=$(h5ls "$TMP/feat.h5" | awk '{print $1}' | sort | tr '\n' ' ')
  [ "$sets" = "layer_1 layer_3 loss_mask offsets tokens " ] || { echo "FAIL: --for-config wrote: $sets"; fails=$((fails + 1)); }
  h5ls -v "$TMP/feat.h5/layer_1" | grep -q "native unsigned short" || { echo "FAIL: taps are not 16-bit"; fails=$((fails + 1)); }
  "$BIN" data info "$TMP/feat.h5" >/dev/null 2>&1 || { echo "FAIL: a feature file is not a token file"; fails=$((fails + 1)); }
else
  echo "FAIL: extract --for-config: $(cat "$TMP/x.log")"; fails=$((fails + 1))
fi
"$BIN" extract --model "$TMP/tiny2" --tokens "$TMP/tok.h5" --out "$TMP/f32.h5" --layers 2,final_norm --dtype f32 \
  >/dev/null 2>&1 || { echo "FAIL: extract --dtype f32"; fails=$((fails + 1)); }
sets=$(h5ls "$TMP/f32.h5" | awk '{print $1}' | sort | tr '\n' ' ')
[ "$sets" = "final_norm layer_2 loss_mask offsets tokens " ] || { echo "FAIL: --layers 2,final_norm wrote: $sets"; fails=$((fails + 1)); }
expect_fail "listed twice" "$BIN" extract --model "$TMP/tiny2" --tokens "$TMP/tok.h5" --out "$TMP/o.h5" --layers 1,1

# An FP8 checkpoint (model init --fp8: block-scaled e4m3 projections) extracts like any other; the same
# weights with a config.json that lost its quantization_config name the tensor and the key.
"$BIN" model init --hf-config "$SRC/configs/tiny-target.json" --out "$TMP/fp8" --fp8 >/dev/null
grep -q '"quant_method": "fp8"' "$TMP/fp8/config.json" \
  || { echo "FAIL: --fp8 wrote no quantization_config"; fails=$((fails + 1)); }
"$BIN" extract --model "$TMP/fp8" --tokens "$TMP/tok.h5" --out "$TMP/fp8.h5" --layers 1 >/dev/null 2>&1 \
  || { echo "FAIL: extract from an FP8 checkpoint"; fails=$((fails + 1)); }
cp "$SRC/configs/tiny-target.json" "$TMP/fp8/config.json"
expect_fail "quantization_config" "$BIN" extract --model "$TMP/fp8" --tokens "$TMP/tok.h5" --out "$TMP/o.h5"

echo "$fails failed"
[ $fails -eq 0 ]
