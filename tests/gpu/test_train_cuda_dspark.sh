#!/usr/bin/env bash
# A DSpark drafter (drafter.kind = "dspark") on the GPU end to end: a CUDA target rank and a CUDA drafter rank
# share the GPU over the MPI feature channel for 40 steps of the tiny config with an RNN Markov head and the
# confidence head over [h ; W1[prev]] (the drafter step's head and loss run kernels/train/dspark_head.cu, the
# target streams its final hidden state for the L1 term): the loss falls; the export then decodes
# speculatively on the GPU (`eval --device cuda`, DSpark's own proposals), with every proposal verified and
# with the confidence-based verify length, and prints τ over the prompts, each continuation of the asked
# length. That the committed tokens are the target's greedy ones is asserted by test_target_decode_cuda
# (DSparkSpeculativeDecodingCommitsTheGreedyTokens). Skips (77) without a GPU.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }
source "$SRC/tests/mpi/train_common.sh"
write_config "$TMP/d.toml" "$TMP/d" 1 1 40
sed -i -e 's/^device = "cpu"$/device = "cuda"/' \
  -e '/^\[drafter\]/a kind = "dspark"\nmarkov_rank = 8\nmarkov_head_type = "rnn"\nenable_confidence_head = true\nconfidence_head_with_markov = true\nconfidence_head_alpha = 1.0' \
  -e '/^\[train\]/a gamma = 4.0' "$TMP/d.toml"
if ! run_mpi 2 "$TMP/d.log" --config "$TMP/d.toml"; then fail "CUDA target + CUDA DSpark drafter run"; tail -30 "$TMP/d.log"; fi
grep -q "drafter on cuda" "$TMP/d.log" || fail "the DSpark drafter did not train on the CUDA backend"
python3 - "$TMP/d/metrics.jsonl" <<'PY' || fail "the CUDA DSpark drafter's loss did not fall over 40 steps"
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1]) if '"loss"' in x]
first, last = sum(l[:8]) / 8, sum(l[-8:]) / 8
print(f"CUDA DSpark drafter: {len(l)} steps, mean loss of the first 8 {first:.4f}, of the last 8 {last:.4f}")
sys.exit(0 if len(l) == 40 and last < first else 1)
PY

"$BIN" export --config "$TMP/d.toml" --out "$TMP/drafter" >"$TMP/export.log" 2>&1 || fail "export: $(tail -3 "$TMP/export.log")"
"$BIN" model init --hf-config "$SRC/configs/tiny-target.json" --seed 5 --out "$TMP/target" >/dev/null 2>&1 || fail "model init"
for conf in "" "--dspark-confidence 0.5"; do
  # shellcheck disable=SC2086 # conf is empty or two words
  if "$BIN" eval --target "$TMP/target" --drafter "$TMP/drafter" --prompts "$TMP/tokens.h5" --num-prompts 3 \
    --max-new-tokens 24 --device cuda $conf --out "$TMP/eval.jsonl" >"$TMP/eval.log" 2>&1; then
    grep -qE "^tau [0-9]+\.[0-9]{3} over 3 prompts" "$TMP/eval.log" || fail "eval $conf printed no tau: $(tail -3 "$TMP/eval.log")"
    python3 - "$TMP/eval.jsonl" <<'PY' || fail "eval --device cuda $conf of the DSpark drafter: jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3 and all(len(r["tokens"]) == 24 and r["tau"] >= 1 for r in rows), rows
PY
    echo "ok: eval --device cuda $conf with the DSpark drafter: $(grep '^tau' "$TMP/eval.log")"
  else
    fail "eval --device cuda $conf of the DSpark drafter: $(tail -5 "$TMP/eval.log")"
  fi
done
echo "$fails failed"
[ "$fails" -eq 0 ]
