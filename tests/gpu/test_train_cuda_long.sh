#!/usr/bin/env bash
# The one-GPU pipeline at length (issue 10 item 6): a CUDA target rank and a CUDA drafter rank sharing the GPU,
# features through the device wire pools (the forward writes its taps into a device slot, the drafter trains
# from its receive slot), 200 steps of the tiny config and 200 steps of a Qwen3-8B-shaped run (random target
# weights of the real 8B shapes, the drafter of configs/qwen3-8b.toml, token_budget 4096). Each loss must fall;
# a resume of the tiny run at step 100 must reproduce steps 101..200 bit for bit (the CUDA kernels are
# deterministic). Prints both runs' target and drafter rates from the final metrics line. Skips (77) without a GPU.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }
source "$SRC/tests/mpi/train_common.sh"

# falls LABEL METRICS STEPS: the mean loss of the last 20 steps is below that of the first 20 by > 0.05.
falls() {
  python3 - "$2" "$3" "$1" <<'PY'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if '"loss"' in x]
l = [r["loss"] for r in rows]
first, last = sum(l[:20]) / 20, sum(l[-20:]) / 20
print(f"{sys.argv[3]}: {len(l)} steps, mean loss of the first 20 {first:.4f}, of the last 20 {last:.4f}")
sys.exit(0 if len(l) == int(sys.argv[2]) and last < first - 0.05 else 1)
PY
}

write_config "$TMP/tiny.toml" "$TMP/tiny" 1 1 200 "[pipeline]" "hs_queue_depth = 2"
sed -i -e 's/^device = "cpu"$/device = "cuda"/' -e 's/^interval = 1000$/interval = 100/' "$TMP/tiny.toml"
if run_mpi 2 "$TMP/tiny.log" --config "$TMP/tiny.toml"; then
  falls "tiny, CUDA target + CUDA drafter" "$TMP/tiny/metrics.jsonl" 200 || fail "the tiny loss did not fall"
  grep -m1 -E "step +200/200" "$TMP/tiny.log"
else
  fail "tiny 200-step run"; tail -30 "$TMP/tiny.log"
fi
resumes_like "$TMP/tiny" "$TMP/tiny.toml" 100 200 0 "tiny"

# The Qwen3-8B-shaped run: real shapes, random weights, sequences of 256..2048 tokens of the 8B vocabulary.
"$BIN" data synth --out "$TMP/tok8b.h5" --vocab 151936 --sequences 600 --min-len 256 --max-len 2048 --seed 4 \
  >/dev/null || fail "data synth (8B vocabulary)"
sed -e "s|^dir = .*|dir = \"$TMP/q8b\"|" -e 's|^log_interval = .*|log_interval = 1e-6\nmax_steps = 200|' \
  -e "s|^model = .*|random_config = \"$SRC/tests/fixtures/models/qwen3-8b\"|" \
  -e "s|^train = .*|train = [\"$TMP/tok8b.h5\"]|" -e 's|^token_budget = .*|token_budget = 4096|' \
  -e 's|^targets = .*|targets = 1|' -e 's|^interval = 1000|interval = 100000|' -e 's|^lr = .*|lr = 3e-4|' \
  "$SRC/configs/qwen3-8b.toml" >"$TMP/q8b.toml"
if run_mpi 2 "$TMP/q8b.log" --config "$TMP/q8b.toml"; then
  falls "Qwen3-8B-shaped, CUDA target + CUDA drafter" "$TMP/q8b/metrics.jsonl" 200 || fail "the 8B loss did not fall"
  grep -E "step +200/200|measured per-rank rates|batches/s" "$TMP/q8b.log" | tail -6
else
  fail "Qwen3-8B-shaped 200-step run"; tail -30 "$TMP/q8b.log"
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
