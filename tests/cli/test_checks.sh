#!/usr/bin/env bash
# What `config check` and the size guards refuse before any work starts (issue 17 item 7): each case exits
# non-zero naming the key or file at fault; a good config prints what the run would do.
# Args: <dflash_mpi binary> <source dir>
BIN=$1
SRC=$2
source "$SRC/tests/cli/cli_common.sh"
source "$SRC/tests/mpi/tiny_config.sh"

"$BIN" data synth --out "$TMP/tokens.h5" --vocab 255 --sequences 50 --min-len 24 --max-len 64 --seed 3 >/dev/null ||
  { echo "FAIL: data synth"; exit 1; }
"$BIN" data synth --out "$TMP/short.h5" --vocab 255 --sequences 5 --min-len 2 --max-len 2 --seed 3 >/dev/null ||
  { echo "FAIL: data synth"; exit 1; }
# config FILE RUN_DIR TOKENS: the tiny 1-1 CPU config of the MPI tests, 3 steps.
config() { tiny_config "$1" "$2" "$3" 1 1 3; }

config "$TMP/good.toml" "$TMP/run" "$TMP/tokens.h5"
if out=$("$BIN" config check --config "$TMP/good.toml" 2>&1) && grep -q "anchorable positions" <<<"$out" &&
   grep -q "steps: 0..3 (fresh start)" <<<"$out" && grep -q "config OK" <<<"$out"; then
  echo "ok: config check prints the plan"
else
  echo "FAIL: config check of a good config"; echo "$out"; fails=$((fails + 1))
fi

echo "x" >"$TMP/afile"
config "$TMP/dirfile.toml" "$TMP/afile" "$TMP/tokens.h5"
expect_fail "'run.dir' = \"$TMP/afile\" is a file" "$BIN" config check --config "$TMP/dirfile.toml"
config "$TMP/missing.toml" "$TMP/run" "$TMP/nope.h5"
expect_fail "$TMP/nope.h5: cannot open as HDF5" "$BIN" config check --config "$TMP/missing.toml"
config "$TMP/mask.toml" "$TMP/run" "$TMP/tokens.h5"
sed -i 's/^mask_token_id = 255$/mask_token_id = 256/' "$TMP/mask.toml"
expect_fail "drafter.mask_token_id 256 is not below the target's vocab 256" \
  "$BIN" config check --config "$TMP/mask.toml"
config "$TMP/taps.toml" "$TMP/run" "$TMP/tokens.h5"
sed -i 's/^target_layer_ids = \[1, 3\]$/target_layer_ids = [1, 9]/' "$TMP/taps.toml"
expect_fail "drafter.target_layer_ids holds layer 9 but the target has 4 layers" \
  "$BIN" config check --config "$TMP/taps.toml"
# Sequences of 2 tokens with a prompt mask: no block can anchor anywhere.
config "$TMP/short.toml" "$TMP/run" "$TMP/short.h5"
expect_fail "have no position to train on" "$BIN" config check --config "$TMP/short.toml"

# Sizes that could never fit in memory are refused at once, with the size.
expect_fail "GiB of host memory but this machine has" \
  "$BIN" data synth --out "$TMP/huge.h5" --vocab 255 --sequences 10 --min-len 2 --max-len 99999999999
expect_fail "B parameters) needs" "$BIN" model init --hf-config "$SRC/tests/fixtures/models/qwen3.6-27b/config.json" \
  --out "$TMP/m27b"
[ -e "$TMP/huge.h5" ] && { echo "FAIL: a refused synth left a file"; fails=$((fails + 1)); }
echo "$fails failed"
[ "$fails" -eq 0 ]
