#!/usr/bin/env bash
# target.dtype = "fp8" end to end on the GPU (issue 16 item 3): a CUDA target rank and a CUDA drafter rank sharing
# one GPU train the tiny config for 150 steps twice on the same data, once from the FP8 target's taps and once from
# the bf16 target's. Skips (77) without a GPU.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }
source "$SRC/tests/mpi/train_common.sh"
for dt in bf16 fp8; do
  write_config "$TMP/$dt.toml" "$TMP/$dt" 1 1 150
  sed -i "s/^device = \"cpu\"$/device = \"cuda\"\ndtype = \"$dt\"/" "$TMP/$dt.toml"
  run_mpi 2 "$TMP/$dt.log" --config "$TMP/$dt.toml" || { fail "$dt run"; tail -20 "$TMP/$dt.log"; }
  grep -q "role target0 device cuda:0" "$TMP/$dt.log" || fail "the $dt target did not run on cuda:0"
done
grep -q 'target.dtype *= "fp8"' "$TMP/fp8.log" || fail "the fp8 run's config table lacks target.dtype = \"fp8\""
# The margin: each step's loss within rtol 2e-2 + atol 2e-2 of the bf16-target run's, the bound
# test_train_cuda_target.sh puts on the bf16 CUDA target against the fp32 CPU target. FP8 taps may cost the
# drafter no more than bf16 taps cost it against fp32 ones; a wrong scale or a lost tap moves the curve by more.
python3 "$SRC/tests/mpi/compare_losses.py" "$TMP/fp8/metrics.jsonl" "$TMP/bf16/metrics.jsonl" 2e-2 2e-2 \
  "FP8 CUDA target vs bf16 CUDA target, 150 steps" || fail "FP8-target losses left the bf16 run's"
[ "$(losses "$TMP/fp8/metrics.jsonl")" != "$(losses "$TMP/bf16/metrics.jsonl")" ] ||
  fail "FP8 and bf16 losses are bit-identical: the FP8 GEMMs never ran"
# τ (the acceptance length the drafter's training predicts) of the last 20 steps within 0.05, the CPU test's margin.
python3 - "$TMP/fp8/metrics.jsonl" "$TMP/bf16/metrics.jsonl" <<'PY' || fail "tau of FP8 vs bf16"
import json, sys
rows = [[j for j in map(json.loads, open(f)) if "tau" in j] for f in sys.argv[1:3]]
(a, la), (b, lb) = ((sum(r["tau"] for r in x[-20:]) / 20, sum(r["loss"] for r in x[-20:]) / 20) for x in rows)
print(f"last 20 steps: tau fp8 {a:.4f} bf16 {b:.4f}; mean loss fp8 {la:.4f} bf16 {lb:.4f}")
assert abs(a - b) <= 0.05, (a, b)
PY
echo "$fails failed"
[ "$fails" -eq 0 ]
