#!/usr/bin/env bash
# Training on CPU ranks with 1-1, 2-1 and 2-2 target-drafter splits: each finishes, checkpoints, logs metrics.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
source "$SRC/tests/mpi/train_common.sh"
for split in "1 1" "2 1" "2 2"; do
  set -- $split
  name="t$1d$2"
  write_config "$TMP/$name.toml" "$TMP/$name" "$1" "$2" 6
  if ! run_mpi $(($1 + $2)) "$TMP/$name.log" --config "$TMP/$name.toml"; then
    fail "$name exited non-zero"; tail -20 "$TMP/$name.log"; continue
  fi
  [ -f "$TMP/$name/checkpoints/step_00000006.h5" ] || fail "$name: no checkpoint for step 6"
  n=$(step_lines "$TMP/$name/metrics.jsonl")
  [ "$n" -eq 6 ] || fail "$name: expected 6 metric lines, got $n"
  grep -q "role drafter" "$TMP/$name.log" || fail "$name: no start-up line for a drafter"
  grep -q "transport mpi (.*feature payloads and gradients over MPI)" "$TMP/$name.log" ||
    fail "$name: the start-up line does not say what carries the features: $(grep -m1 transport "$TMP/$name.log")"
  echo "ok: split $1-$2 ($(tail -1 "$TMP/$name/metrics.jsonl" | cut -c1-80)...)"
done
# pipeline.hs_queue_depth = 1: one send slot per target and one credit per drafter, so a target cannot start a
# forward into its slot before its previous batch has reached its drafter. Flow control changes nothing else:
# the same batches train in the same order, so the losses equal the 2-2 run's (depth 2) exactly.
write_config "$TMP/q1.toml" "$TMP/q1" 2 2 6 "[pipeline]" "hs_queue_depth = 1"
if run_mpi 4 "$TMP/q1.log" --config "$TMP/q1.toml"; then
  python3 "$SRC/tests/mpi/compare_losses.py" "$TMP/q1/metrics.jsonl" "$TMP/t2d2/metrics.jsonl" 0 0 \
    "2-2 with hs_queue_depth 1 vs 2" || fail "hs_queue_depth 1 changed the losses"
else
  fail "hs_queue_depth 1 run"; tail -20 "$TMP/q1.log"
fi
# The step's loss is normalised by the global Σw across drafters: 2 drafters x grad_accum 1 train on the same
# global batches per step as 1 drafter x grad_accum 2 (batch = step*2 + micro*D + d) and must give the same
# losses. Tolerance rtol 1e-6: the only difference is the fp32 order in which the two micro-batches' gradients
# are summed (accumulated into one buffer vs added by the all-reduce): measured ~1e-9 relative after 6
# AdamW steps; a normalisation by the local instead of the global Σw moves the loss far more.
write_config "$TMP/d2a1.toml" "$TMP/d2a1" 1 2 6
write_config "$TMP/d1a2.toml" "$TMP/d1a2" 1 1 6
sed -i 's/^grad_accum = 2$/grad_accum = 1/' "$TMP/d2a1.toml"
if run_mpi 3 "$TMP/d2a1.log" --config "$TMP/d2a1.toml" && run_mpi 2 "$TMP/d1a2.log" --config "$TMP/d1a2.toml"; then
  python3 "$SRC/tests/mpi/compare_losses.py" "$TMP/d2a1/metrics.jsonl" "$TMP/d1a2/metrics.jsonl" 1e-6 0 \
    "2 drafters x grad_accum 1 vs 1 drafter x grad_accum 2" || fail "D=2 x ga=1 and D=1 x ga=2 losses differ"
else
  fail "D=2 x ga=1 / D=1 x ga=2 runs"; tail -20 "$TMP/d2a1.log" "$TMP/d1a2.log"
fi
# The loss variants end to end: soft-KL (targets also send their final-norm hidden state), streak weighting
# and context-feature noise.
write_config "$TMP/kl.toml" "$TMP/kl" 2 1 6
sed -i 's/^grad_accum = 2$/grad_accum = 2\nloss = "kl"\nstreak = true\nstreak_alpha = 0.5\nnoise_std = 0.1/' "$TMP/kl.toml"
if run_mpi 3 "$TMP/kl.log" --config "$TMP/kl.toml" && [ "$(step_lines "$TMP/kl/metrics.jsonl")" -eq 6 ] &&
   losses "$TMP/kl/metrics.jsonl" |
     python3 -c 'import sys,math; sys.exit(0 if all(math.isfinite(float(v)) and float(v) >= 0 for v in sys.stdin) else 1)'; then
  echo "ok: soft-KL + streak + noise run ($(tail -1 "$TMP/kl/metrics.jsonl" | cut -c1-60)...)"
else
  fail "soft-KL run"; tail -20 "$TMP/kl.log"
fi
# drafter.max_block_rows: 16 rows = 2 blocks of 8 per micro-batch, fewer than the anchors of a 256-token batch, so
# anchors are dropped, counted in metrics.jsonl, and training goes on.
write_config "$TMP/cap.toml" "$TMP/cap" 1 1 4
sed -i 's/^num_anchors = 4$/num_anchors = 4\nmax_block_rows = 16/' "$TMP/cap.toml"
if run_mpi 2 "$TMP/cap.log" --config "$TMP/cap.toml" && [ "$(step_lines "$TMP/cap/metrics.jsonl")" -eq 4 ] &&
   python3 -c 'import json,sys,math; l=[json.loads(x) for x in open(sys.argv[1]) if "loss" in x]; sys.exit(0 if all(x["anchors_dropped"] > 0 and math.isfinite(x["loss"]) for x in l) else 1)' "$TMP/cap/metrics.jsonl"; then
  echo "ok: anchors over max_block_rows dropped ($(tail -1 "$TMP/cap/metrics.jsonl" | grep -o '"anchors_dropped":[0-9.]*'))"
else
  fail "max_block_rows run"; tail -20 "$TMP/cap.log"; tail -2 "$TMP/cap/metrics.jsonl"
fi
# Roles from a rankfile (given to dflash_mpi, as DFLASH_RANKFILE would be): here the drafter is rank 0.
host=$(hostname)
printf 'rank 0=%s slot=0  # role=drafter gpu=0\nrank 1=%s slot=0  # role=target\nrank 2=%s slot=0  # role=target\n' \
  "$host" "$host" "$host" >"$TMP/roles.rf"
write_config "$TMP/rf.toml" "$TMP/rf" 2 1 4
if run_mpi 3 "$TMP/rf.log" --config "$TMP/rf.toml" --rankfile "$TMP/roles.rf" &&
   grep -q "\[rank 0 .* role drafter0 " "$TMP/rf.log" && grep -q "(roles from --rankfile" "$TMP/rf.log"; then
  echo "ok: roles from --rankfile (rank 0 is the drafter)"
else
  fail "rankfile roles"; tail -20 "$TMP/rf.log"
fi
# A CUDA run that cannot fit its GPU stops before loading anything, printing the VRAM table (this runs
# without a GPU too: the check needs only the configs; 1e9 tokens per batch fit no GPU).
write_config "$TMP/big.toml" "$TMP/big" 1 1 2
sed -i -e 's/^device = "cpu"$/device = "cuda"/' -e 's/^token_budget = 256$/token_budget = 1000000000/' "$TMP/big.toml"
run_mpi 2 "$TMP/big.log" --config "$TMP/big.toml" && fail "a run that cannot fit was started"
if grep -q "FATAL: .*does not fit" "$TMP/big.log" && grep -qi "target rank" "$TMP/big.log"; then
  echo "ok: VRAM check stops an impossible CUDA run: $(grep FATAL "$TMP/big.log" | head -1 | cut -c1-110)"
else
  fail "VRAM check at start-up"; tail -30 "$TMP/big.log"
fi
# A world size that does not match [topology] is refused with a message naming both numbers.
write_config "$TMP/bad.toml" "$TMP/bad" 2 1 2
run_mpi 2 "$TMP/bad.log" --config "$TMP/bad.toml" && fail "2 ranks for a 2+1 topology were accepted"
grep -q "2 targets + 1 drafter = 3 ranks but 2 were started" "$TMP/bad.log" || { fail "wrong-size message"; cat "$TMP/bad.log"; }
echo "$fails failed"
[ "$fails" -eq 0 ]
