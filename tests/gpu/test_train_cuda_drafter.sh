#!/usr/bin/env bash
# The whole pipeline on one GPU: a CUDA target rank and a CUDA drafter rank (bf16 drafter with fp32 master
# weights) sharing the H200 over the MPI feature channel. 60 steps of the tiny config: the loss falls, the first
# 50 steps follow the CPU drafter's (fp32 oracle, same data, same init) within ATOL50 below, and a resume of
# step 30 reproduces steps 31..60 of the straight run within 2e-2 (the CUDA kernels are deterministic, so the
# resume is expected to be exact; the tolerance states what the test promises). Skips (77) without a GPU.
# Args: <dflash_mpi> <source dir> <mpiexec>
BIN=$1 SRC=$2 MPIEXEC=$3
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }
source "$SRC/tests/mpi/train_common.sh"
write_config "$TMP/gpu.toml" "$TMP/gpu" 1 1 60
sed -i -e 's/^device = "cpu"$/device = "cuda"/' "$TMP/gpu.toml"
sed -i -e 's/^interval = 1000$/interval = 30/' "$TMP/gpu.toml"
if ! run_mpi 2 "$TMP/gpu.log" --config "$TMP/gpu.toml"; then fail "CUDA target + CUDA drafter run"; tail -30 "$TMP/gpu.log"; fi
grep -q "role drafter0 device cuda:0" "$TMP/gpu.log" || fail "the drafter did not run on cuda:0"
grep -q "drafter on cuda" "$TMP/gpu.log" || fail "the drafter did not train on the CUDA backend"
python3 - "$TMP/gpu/metrics.jsonl" <<'PY' || fail "the loss did not fall over 60 steps"
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1]) if '"loss"' in x]
first, last = sum(l[:10]) / 10, sum(l[-10:]) / 10
print(f"CUDA drafter: {len(l)} steps, mean loss of the first 10 {first:.4f}, of the last 10 {last:.4f}")
sys.exit(0 if len(l) == 60 and last < first - 0.05 else 1)
PY
# The same 60-step schedule on the CPU drafter, stopped after step 50.
# ATOL50, the bound on |loss_cuda - loss_cpu| at every one of the 50 steps (loss ~6.0 -> 5.6). The bf16
# drafter differs from the fp32 oracle by rounding (activations, the weight shadow), and a rounding difference in
# one step carries into the next ones through the weights. Measured: steps 1..5 within 1.7e-4 on the H200
# (2026-12-01). No GPU here, so the growth was measured on the CPU oracle with a perturbation of that kind,
# feature noise on the taps (train.noise_std 0.004, about bf16's relative rounding 2^-8, and 0.02; both
# cosine-decayed like the lr): the loss moves by at most 9.1e-5 / 7.9e-5 over steps 1..5, 2.0e-4 / 2.2e-4 over
# 1..10 and 2.2e-4 / 2.9e-4 over 1..50: it levels off rather than grows. Scaled by the 1.7e-4 / 9.1e-5 seen at
# step 5, the CUDA run should stay within ~6e-4 over 50 steps; 2e-3 gives 3x margin. Two CPU runs with 1 and 2
# BLAS threads agree bit for bit, so the oracle adds no noise of its own. What a bug moves: the learning rate
# 2 % higher, 5.1e-3 by step 10; 10 % higher, 2.5e-2; another init seed, 2.9e-2; so 2e-3 still fails a 2 %
# error in the update. compare_losses.py prints how the difference grows with the steps.
ATOL50=2e-3
write_config "$TMP/cpu.toml" "$TMP/cpu" 1 1 60
if run_mpi 2 "$TMP/cpu.log" --config "$TMP/cpu.toml" --stop-at-step 50; then
  head -51 "$TMP/gpu/metrics.jsonl" >"$TMP/gpu50.jsonl"
  python3 "$SRC/tests/mpi/compare_losses.py" "$TMP/gpu50.jsonl" "$TMP/cpu/metrics.jsonl" 0 "$ATOL50" \
    "CUDA drafter vs CPU drafter, first 50 steps" || fail "the CUDA drafter's losses leave the CPU's by > $ATOL50"
else
  fail "CPU reference run"; tail -30 "$TMP/cpu.log"
fi
resumes_like "$TMP/gpu" "$TMP/gpu.toml" 30 60 2e-2 "CUDA drafter"
echo "$fails failed"
[ "$fails" -eq 0 ]
