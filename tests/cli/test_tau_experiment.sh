#!/usr/bin/env bash
# benchmarks/tau_experiment.sh in seconds, without running the experiment: its argument checks refuse bad values
# naming the option, it refuses an output folder that already holds results (nothing overwritten), and the run
# configs its helper writes for the four kinds pass `config check` with each kind's own keys in force and the
# shared settings equal; `table` renders results.jsonl.
# Args: <dflash_mpi binary> <source dir>
BIN=$1
SRC=$2
source "$SRC/tests/cli/cli_common.sh"
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
$PY -c "import tomllib" 2>/dev/null || { echo "SKIP: $PY has no tomllib (python >= 3.11)"; exit 77; }
SH="$SRC/benchmarks/tau_experiment.sh"
HELP="$SRC/benchmarks/tau_experiment.py"

out=$(bash "$SH" --help 2>&1)
if [ $? -eq 0 ] && grep -qF -- "--dspark-confidence P" <<<"$out"; then echo "ok: --help"; else
  echo "FAIL: --help"; echo "$out"; fails=$((fails + 1)); fi
expect_fail "--steps '0': expected a positive integer" bash "$SH" --bin "$BIN" --steps 0
expect_fail "--eval-tokens 'x': expected a positive integer" bash "$SH" --bin "$BIN" --eval-tokens x
expect_fail "--kinds: unknown kind 'eagle3'" bash "$SH" --bin "$BIN" --kinds dflash,eagle3
expect_fail "--targets: unknown target 'moe'" bash "$SH" --bin "$BIN" --targets moe
expect_fail "--dspark-confidence '1.5'" bash "$SH" --bin "$BIN" --dspark-confidence 1.5
expect_fail "unknown option '--step'" bash "$SH" --bin "$BIN" --step 3
expect_fail "--out needs a value" bash "$SH" --out
expect_fail "$TMP/none: no dflash_mpi binary" bash "$SH" --bin "$TMP/none"
mkdir -p "$TMP/done"
echo '{"target": "dense", "variant": "dflash", "tau": 1.5, "prompts": 2, "log": "x"}' >"$TMP/done/results.jsonl"
expect_fail "results.jsonl exists" bash "$SH" --bin "$BIN" --out "$TMP/done"
[ "$(wc -l <"$TMP/done/results.jsonl")" = 1 ] || { echo "FAIL: results.jsonl was touched"; fails=$((fails + 1)); }

out=$($PY "$HELP" table "$TMP/done" 2>&1)
if grep -qF "| dflash | 1.500 |" <<<"$out" && [ -f "$TMP/done/results.md" ]; then echo "ok: table"; else
  echo "FAIL: table"; echo "$out"; fails=$((fails + 1)); fi

$PY "$HELP" target dense --out "$TMP/dense.json" &&
  "$BIN" model init --hf-config "$TMP/dense.json" --out "$TMP/model" >/dev/null &&
  "$BIN" data synth --out "$TMP/train.h5" --vocab 63 --sequences 8 --min-len 16 --max-len 120 --seed 1 >/dev/null ||
  { echo "FAIL: target / data set-up"; exit 1; }
for k in dflash domino dspark dflash2; do
  $PY "$HELP" config --kind $k --target-dir "$TMP/model" --data "$TMP/train.h5" --run-dir "$TMP/run-$k" \
    --steps 7 --seed 3 --out "$TMP/$k.toml" || { echo "FAIL: config $k"; fails=$((fails + 1)); continue; }
  out=$("$BIN" config check --config "$TMP/$k.toml" 2>&1)
  if [ $? -eq 0 ] && grep -q "config OK" <<<"$out" && grep -q "drafter: kind $k, 1 layers" <<<"$out"; then
    echo "ok: config check passes the $k config"
  else
    echo "FAIL: config check of the $k config"; echo "$out" | tail -20; fails=$((fails + 1))
  fi
done
# Only the kind and its own keys differ: every line of the dflash config but its run dir is in the others.
for k in domino dspark dflash2; do
  grep -q "^kind = \"$k\"$" "$TMP/$k.toml" && grep -q '^max_steps = 7$' "$TMP/$k.toml" &&
    grep -q '^seed = 3$' "$TMP/$k.toml" ||
    { echo "FAIL: $k config lacks kind, steps or seed"; fails=$((fails + 1)); }
done
base=$(grep -v -e '^dir = ' -e '^#' "$TMP/dflash.toml" | grep -v '^$')
for k in domino dspark dflash2; do
  missing=$(grep -F -x -v -f <(grep -v '^$' "$TMP/$k.toml") <<<"$base")
  if [ -n "$missing" ]; then
    echo "FAIL: the $k config changes the shared settings: $missing"; fails=$((fails + 1))
  else
    echo "ok: the $k config keeps every dflash setting"
  fi
done

[ $fails -eq 0 ] && echo "PASS" || { echo "$fails check(s) failed"; exit 1; }
