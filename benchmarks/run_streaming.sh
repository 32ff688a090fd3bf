#!/usr/bin/env bash
# What streaming costs on one GPU (issue 10 item 6): the Qwen3-8B-shaped pipeline (a CUDA target rank and a
# CUDA drafter rank sharing the GPU, features through the device wire pools, batches of 8 x 4096 tokens) against
# the two halves timed alone in the same call: bench_target_forward 8b (the forward of 8 x 4096 tokens) and
# bench_drafter_step --model 8b --seq-len 32768 (a drafter step on 32,768 context tokens, 512 anchors).
# On one GPU the two ranks time-share the device, so the pipeline cannot beat forward + step per batch; the
# overhead of streaming is how far the measured seconds per step exceed that sum. (With a GPU per rank the
# target's own rate is the direct measure; that needs a multi-GPU machine.) The drafter step alone sees one
# 32,768-token sequence, the pipeline eight of 4096 (shorter attention context), which favours the pipeline
# slightly: the overhead printed is a lower bound of the truth by that much.
#
#   benchmarks/run_streaming.sh [BUILD_DIR] [STEPS]      (default: build, 40 steps; the first 8 are warm-up)
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$here/build}"
steps="${2:-40}"
bin="$build/dflash_mpi"
mpiexec="${MPIEXEC:-mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for b in "$bin" "$build/benchmarks/bench_target_forward" "$build/benchmarks/bench_drafter_step"; do
  [[ -x "$b" ]] || { echo "run_streaming: $b not built" >&2; exit 2; }
done
(( steps > 12 )) || { echo "run_streaming: STEPS must be > 12 (8 warm-up steps are dropped)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
json_of() { grep '^{' "$1" | tail -n 1; }

echo "=== the target forward alone: bench_target_forward 8b"
timeout 300 "$build/benchmarks/bench_target_forward" 8b >"$tmp/fwd.log" 2>&1 || { tail -20 "$tmp/fwd.log"; exit 1; }
grep -E "tok/s" "$tmp/fwd.log" | tail -2
echo "=== the drafter step alone: bench_drafter_step --model 8b --seq-len 32768"
(cd "$here" && timeout 300 "$build/benchmarks/bench_drafter_step" --model 8b --seq-len 32768 --steps 5) \
  >"$tmp/step.log" 2>&1 || { tail -20 "$tmp/step.log"; exit 1; }
grep -E "s/step" "$tmp/step.log" | tail -2

echo "=== the pipeline: 1 CUDA target + 1 CUDA drafter on this GPU, $steps steps of 8 x 4096 tokens"
"$bin" data synth --out "$tmp/tok.h5" --vocab 151936 --sequences 400 --min-len 4096 --max-len 4096 --seed 5 \
  >/dev/null || { echo "run_streaming: data synth failed" >&2; exit 1; }
sed -e "s|^dir = .*|dir = \"$tmp/run\"|" -e "s|^log_interval = .*|log_interval = 1e-6\nmax_steps = $steps|" \
  -e "s|^model = .*|random_config = \"$here/tests/fixtures/models/qwen3-8b\"|" \
  -e "s|^train = .*|train = [\"$tmp/tok.h5\"]|" -e 's|^token_budget = .*|token_budget = 32768|' \
  -e 's|^targets = .*|targets = 1|' -e 's|^interval = 1000|interval = 100000|' \
  "$here/configs/qwen3-8b.toml" >"$tmp/run.toml"
timeout 420 "$mpiexec" --oversubscribe -np 2 "$bin" --config "$tmp/run.toml" >"$tmp/run.log" 2>&1 ||
  { tail -30 "$tmp/run.log"; exit 1; }
grep -E "transport|step +$steps/$steps" "$tmp/run.log" | tail -3

python3 - "$(json_of "$tmp/fwd.log")" "$(json_of "$tmp/step.log")" "$tmp/run/metrics.jsonl" <<'PY'
import json, sys
fwd, step = json.loads(sys.argv[1]), json.loads(sys.argv[2])
rows = [j for j in map(json.loads, open(sys.argv[3])) if "loss" in j]
warm = 8
t = [r["elapsed_s"] for r in rows]
per_step = (t[-1] - t[warm - 1]) / (len(t) - warm)
f, d = fwd["seconds"], step["seconds_per_step"]
ideal = f + d
tgt = sum(r["tgt_batches_s"] for r in rows[warm:]) / len(rows[warm:])
dft = sum(r["dft_batches_s"] for r in rows[warm:]) / len(rows[warm:])
print(f"forward alone {f:.4f} s/batch; drafter step alone {d:.4f} s; sum {ideal:.4f} s")
print(f"pipeline {per_step:.4f} s/step over steps {warm + 1}..{len(t)} -> {per_step / ideal - 1:+.2%} against the sum "
      f"(time-shared GPU: < 0 means the ranks overlapped, > 0 is what streaming cost)")
print(f"busy rates while sharing the GPU: target {tgt:.3f} b/s (alone {1 / f:.3f}), drafter {dft:.3f} b/s "
      f"(alone {1 / d:.3f})")
print(json.dumps({"bench": "run_streaming", "forward_s": f, "drafter_step_s": d, "pipeline_step_s": per_step,
                  "overhead_vs_sum": per_step / ideal - 1, "target_busy_bps": tgt, "drafter_busy_bps": dft,
                  "steps": len(t), "warmup_steps": warm}))
PY
