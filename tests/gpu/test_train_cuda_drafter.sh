#!/usr/bin/env bash
# The whole pipeline on one GPU: a CUDA target rank and a CUDA drafter rank (bf16 drafter with fp32 master
# weights) sharing the H200 over the MPI feature channel. 60 steps of the tiny config: the loss falls, the first
# steps follow the CPU drafter's (fp32 oracle, same data, same init: the bf16 drafter's loss may move by the
# bf16 rounding of its activations and weights, ~1e-2 relative, far less than a wrong gradient moves it within
# a few steps), and a resume of step 30 reproduces steps 31..60 of the straight run within the same bound
# (the CUDA kernels are deterministic, so the resume is expected to be exact; the tolerance states what the
# test promises). Skips (77) without a GPU. Args: <dflash_mpi> <source dir> <mpiexec>
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
# The same 60-step schedule on the CPU drafter, stopped after step 5.
write_config "$TMP/cpu.toml" "$TMP/cpu" 1 1 60
if run_mpi 2 "$TMP/cpu.log" --config "$TMP/cpu.toml" --stop-at-step 5; then
  head -6 "$TMP/gpu/metrics.jsonl" >"$TMP/gpu5.jsonl"
  python3 "$SRC/tests/mpi/compare_losses.py" "$TMP/gpu5.jsonl" "$TMP/cpu/metrics.jsonl" 2e-2 2e-2 \
    "CUDA drafter vs CPU drafter, first 5 steps" || fail "the CUDA drafter's first losses differ from the CPU's"
else
  fail "CPU reference run"; tail -30 "$TMP/cpu.log"
fi
mkdir -p "$TMP/res/checkpoints"
cp "$TMP/gpu/checkpoints/step_00000030.h5" "$TMP/res/checkpoints/" && echo step_00000030.h5 >"$TMP/res/checkpoints/latest"
sed "s|$TMP/gpu|$TMP/res|" "$TMP/gpu.toml" >"$TMP/res.toml"
if run_mpi 2 "$TMP/res.log" --config "$TMP/res.toml"; then
  python3 - "$TMP/gpu/metrics.jsonl" "$TMP/res/metrics.jsonl" <<'PY' || fail "the resumed run's losses differ"
import json, sys
a = [json.loads(x)["loss"] for x in open(sys.argv[1]) if '"loss"' in x][30:]
b = [json.loads(x)["loss"] for x in open(sys.argv[2]) if '"loss"' in x]
worst = max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) == 30 else float("inf")
print(f"resume of step 30: steps 31..60 differ by at most {worst:.3g} ({'bit-identical' if worst == 0 else 'not bit-identical'})")
sys.exit(0 if worst <= 2e-2 else 1)
PY
else
  fail "resume run"; tail -30 "$TMP/res.log"
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
