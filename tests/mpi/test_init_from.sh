#!/usr/bin/env bash
# drafter.init_from: a fresh run started from an exported drafter begins where that drafter was (its first loss
# is the trained one's, far below a random init's), says so, and starts at step 0 with a fresh optimizer; a run
# whose drafter differs from the folder's is refused naming the config.json field.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"
first_loss() { losses "$1" | head -1; }

write_config "$TMP/a.toml" "$TMP/a" 1 1 30
run_mpi 2 "$TMP/a.log" --config "$TMP/a.toml" || { fail "training run"; tail -20 "$TMP/a.log"; }
"$BIN" export --config "$TMP/a.toml" --out "$TMP/export" >"$TMP/export.log" 2>&1 || { fail "export"; cat "$TMP/export.log"; }

write_config "$TMP/b.toml" "$TMP/b" 1 1 2
sed -i "/^\[drafter\]/a init_from = \"$TMP/export\"" "$TMP/b.toml"
run_mpi 2 "$TMP/b.log" --config "$TMP/b.toml" || { fail "init_from run"; tail -20 "$TMP/b.log"; }
grep -q "drafter weights from $TMP/export (optimizer state fresh)" "$TMP/b.log" || fail "no init_from line in the log"
a0=$(first_loss "$TMP/a/metrics.jsonl") b0=$(first_loss "$TMP/b/metrics.jsonl")
a_end=$(losses "$TMP/a/metrics.jsonl" | tail -1)
# b's first step sees the same first batch as a's (same seed and data) but with the trained weights: its loss
# must be nearer a's last loss than a's first (random init, ~ln 256).
if python3 -c "import sys; a0, ae, b0 = map(float, sys.argv[1:]); sys.exit(not abs(b0 - ae) < abs(b0 - a0))" \
  "$a0" "$a_end" "$b0"; then
  echo "ok: init_from run starts at loss $b0 (trained run: $a0 -> $a_end)"
else
  fail "init_from run starts at loss $b0, trained run went $a0 -> $a_end"
fi

write_config "$TMP/c.toml" "$TMP/c" 1 1 2
sed -i -e "/^\[drafter\]/a init_from = \"$TMP/export\"" -e "s/^intermediate = 96/intermediate = 64/" "$TMP/c.toml"
run_mpi 2 "$TMP/c.log" --config "$TMP/c.toml" && fail "init_from with another intermediate size was accepted"
grep -q "config.json has intermediate_size = 96 but this run's drafter has 64 (drafter.intermediate)" "$TMP/c.log" ||
  { fail "mismatch not named"; tail "$TMP/c.log"; }
echo "$fails failed"
[ "$fails" -eq 0 ]
