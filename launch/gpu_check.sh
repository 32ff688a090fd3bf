#!/usr/bin/env bash
# One call on the GPU machine: configure with the carried .deps (toml++, CLI11, nlohmann-json, Google Benchmark:
# ../shared/device/README.md), build, then run each step named on the command line with a timeout, logging to
# $OUT (or ./gpu-logs; at most 8 files come back from a device call, so steps share extra.log). Steps: gpu (ctest -L gpu), profiles (ctest -L gpu under each DFLASH_GPU_PROFILE
# of GPU_PROFILES, default sm120 sm100 sm89 sm80; GPU_PROFILE_TESTS narrows it to a ctest -R regex), kernels (bench_kernels), forward (bench_target_forward),
# drafter (benchmarks/run_drafter_step.sh: ours and SpecForge's step in the same call), forward_peer
# (benchmarks/run_target_forward.sh: our target forward and HF + FLA's in the same call), golden (the drafter
# golden from SpecForge into $OUT/drafter), tokgolden (the tokenizer golden into $OUT/tokenizer), hfgolden
# (the fp32 target goldens named by GOLDEN_MODELS, none by default: every committed one exists; then every
# model's HF-bf16 error, into tests/golden/data here and $OUT/golden.tar, then the CPU and CUDA golden
# tests on them), or any quoted shell command. The 27B peer and hfgolden need the
# lead's .peer/ carried. GPU_TARGETS limits the build to those targets. Example: bash launch/gpu_check.sh gpu drafter
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-logs}
B=${GPU_BUILD_DIR:-/tmp/df-gpu-build}
GOLDEN_MODELS=${GOLDEN_MODELS:-}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# cuDNN: the toolkit's, else the one torch's wheels bring (nvidia/cudnn in site-packages, no unversioned .so).
cudnn_args=()
if ! ls /usr/local/cuda/lib64/libcudnn.so* > /dev/null 2>&1; then
  cudnn=$(python3 -c 'import nvidia.cudnn as c; print(list(c.__path__)[0])' 2> /dev/null)
  if [[ -n "$cudnn" && -f "$cudnn/lib/libcudnn.so.9" ]]; then
    cudnn_args=(-DCUDNN_LIBRARY="$cudnn/lib/libcudnn.so.9" -DCUDNN_INCLUDE_DIR="$cudnn/include")
    export LD_LIBRARY_PATH=$cudnn/lib:$LD_LIBRARY_PATH
  fi
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  cmake -S "$ROOT" -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$ROOT/.deps/usr" \
    -DCMAKE_CUDA_ARCHITECTURES=90 "${cudnn_args[@]}" && timeout 420 cmake --build "$B" -j"$(nproc)" ${GPU_TARGETS:+--target $GPU_TARGETS}
} > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
echo "build ok"
for step in "$@"; do
  case "$step" in
    gpu) (cd "$B" && timeout ${GPU_TIMEOUT:-420} ctest -L gpu -j${GPU_JOBS:-6} --timeout 240 --output-on-failure) > "$OUT/ctest-gpu.log" 2>&1
         echo "gpu tests: rc=$? $(grep -E 'tests passed|tests failed' "$OUT/ctest-gpu.log")" ;;
    profiles) # The GPU suite again under each test profile (DFLASH_GPU_PROFILE): dispatch acts as on that device.
              for prof in ${GPU_PROFILES:-sm120 sm100 sm89 sm80}; do
                (cd "$B" && DFLASH_GPU_PROFILE=$prof timeout ${GPU_PROFILE_TIMEOUT:-300} ctest -L gpu -j${GPU_JOBS:-6} \
                   --timeout 240 --output-on-failure ${GPU_PROFILE_TESTS:+-R "$GPU_PROFILE_TESTS"}) \
                  > "$OUT/ctest-gpu-$prof.log" 2>&1
                echo "gpu tests under $prof: rc=$? $(grep -E 'tests passed|tests failed' "$OUT/ctest-gpu-$prof.log")"
              done ;;
    kernels) timeout 180 "$B/benchmarks/bench_kernels" > "$OUT/bench-kernels.log" 2>&1; echo "bench_kernels: rc=$?" ;;
    forward) timeout 240 "$B/benchmarks/bench_target_forward" > "$OUT/bench-forward.log" 2>&1
             echo "bench_target_forward: rc=$?" ;;
    drafter) timeout 560 bash "$ROOT/benchmarks/run_drafter_step.sh" all "$B" > "$OUT/bench-drafter.log" 2>&1
             echo "run_drafter_step: rc=$?" ;;
    forward_peer) timeout 560 bash "$ROOT/benchmarks/run_target_forward.sh" all "$B" > "$OUT/forward-peer.log" 2>&1
                  echo "run_target_forward: rc=$?"; tail -3 "$OUT/forward-peer.log" ;;
    hfgolden) G=/tmp/df-golden
              { { [ -z "$GOLDEN_MODELS" ] ||
                  timeout 240 python3 "$ROOT/tests/golden/make_golden.py" --out $G --models "$GOLDEN_MODELS"; } &&
                timeout 300 python3 "$ROOT/tests/golden/make_golden.py" --hf-bf16 --out $G &&
                cp -r $G/. "$ROOT/tests/golden/data/" && tar -C $G -cf "$OUT/golden.tar" .; } > "$OUT/golden.log" 2>&1
              echo "hf-bf16 golden files: rc=$? (into tests/golden/data here and \$OUT/golden.tar)"
              # The binaries, not ctest: they list the models when they start, ctest's list is from build time.
              for t in test_golden test_golden_cuda; do
                timeout 180 "$B/tests/$t" >> "$OUT/golden.log" 2>&1; echo "$t: rc=$?"
              done ;;
    golden) timeout 180 python3 "$ROOT/tests/golden/make_drafter_golden.py" --out "$OUT/drafter" >> "$OUT/extra.log" 2>&1
            echo "drafter golden: rc=$?" ;;
    tokgolden) timeout 120 python3 "$ROOT/tests/golden/make_tokenizer_golden.py" "$OUT/tokenizer" >> "$OUT/extra.log" 2>&1
               echo "tokenizer golden: rc=$?" ;;
    *) (cd "$ROOT" && timeout 300 bash -c "$step") >> "$OUT/extra.log" 2>&1; echo "'$step': rc=$?" ;;
  esac
done
