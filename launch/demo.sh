#!/usr/bin/env bash
# The demo: install what is missing, build, then run a tiny end-to-end job on CPU.
# Today: a random tiny Qwen3.5-style target, a synthetic token corpus, and `extract` of its hidden states.
set -euo pipefail
source "$(dirname "$0")/setup.sh"
BIN="$BUILD_DIR/dflash_mpi"
RUN=${RUN_DIR:-$ROOT_DIR/runs/demo}
mkdir -p "$RUN"
echo "== 1/3 random tiny target (configs/tiny-target.json) -> $RUN/target"
"$BIN" model init --hf-config "$ROOT_DIR/configs/tiny-target.json" --seed 1 --out "$RUN/target"
echo "== 2/3 synthetic corpus -> $RUN/tokens.h5"
"$BIN" data synth --out "$RUN/tokens.h5" --vocab 256 --sequences 64 --min-len 32 --max-len 256 --seed 1
echo "== 3/3 extract hidden states (embeddings, every layer, final norm) -> $RUN/features.h5"
"$BIN" extract --model "$RUN/target" --tokens "$RUN/tokens.h5" --out "$RUN/features.h5" --layers all --device cpu
command -v h5ls >/dev/null && h5ls "$RUN/features.h5"
echo "demo done: $RUN"
