#!/usr/bin/env bash
# The τ experiment: does a drafter kind accept more than DFlash here? On two tiny random targets (a dense Qwen3
# and the demo's hybrid Qwen3.5, vocabulary 64), the target regenerates the training responses itself (`eval
# --generate`, greedy); DFlash, Domino, DSpark and DFlash2 drafters then train on that data with the same steps,
# seed and backbone (configs/tiny*.toml, each kind's own keys as there), 1 target + 1 drafter CPU rank under mpirun,
# and `eval` measures each one's τ on the same held-out prompts (DSpark also with --dspark-confidence).
# Results: OUT/results.jsonl, OUT/results.md (the table), OUT/tau_experiment.png; every log under OUT/.
#
#   bash benchmarks/tau_experiment.sh [--out DIR] [--steps N] [--train-prompts N] [--eval-prompts N]
#        [--gen-tokens N] [--eval-tokens N] [--dspark-confidence P] [--targets dense,hybrid]
#        [--kinds dflash,domino,dspark,dflash2] [--bin PATH] [--seed S]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="runs/tau_experiment"
STEPS=300
TRAIN_PROMPTS=320
EVAL_PROMPTS=24
GEN_TOKENS=96
EVAL_TOKENS=64
CONFIDENCE=0.5
TARGETS="dense,hybrid"
KINDS="dflash,domino,dspark,dflash2"
BIN="$ROOT/build/dflash_mpi"
SEED=1

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "tau_experiment.sh: $*" >&2; exit 2; }
positive() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 '$2': expected a positive integer"; }
while [ $# -gt 0 ]; do
  [ "$1" = "-h" ] || [ "$1" = "--help" ] && { usage; exit 0; }
  [ $# -ge 2 ] || die "$1 needs a value (see --help)"
  case "$1" in
    --out) OUT="$2" ;;
    --steps) positive "$1" "$2"; STEPS="$2" ;;
    --train-prompts) positive "$1" "$2"; TRAIN_PROMPTS="$2" ;;
    --eval-prompts) positive "$1" "$2"; EVAL_PROMPTS="$2" ;;
    --gen-tokens) positive "$1" "$2"; GEN_TOKENS="$2" ;;
    --eval-tokens) positive "$1" "$2"; EVAL_TOKENS="$2" ;;
    --dspark-confidence) CONFIDENCE="$2" ;;
    --targets) TARGETS="$2" ;;
    --kinds) KINDS="$2" ;;
    --bin) BIN="$2" ;;
    --seed) [[ "$2" =~ ^[0-9]+$ ]] || die "--seed '$2': expected a non-negative integer"; SEED="$2" ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift 2
done
[[ "$CONFIDENCE" =~ ^(0(\.[0-9]+)?|1(\.0*)?)$ ]] || die "--dspark-confidence '$CONFIDENCE': expected a number in [0, 1]"
IFS=, read -ra TARGET_LIST <<< "$TARGETS"
IFS=, read -ra KIND_LIST <<< "$KINDS"
for t in "${TARGET_LIST[@]}"; do
  case "$t" in dense|hybrid) ;; *) die "--targets: unknown target '$t' (dense, hybrid)" ;; esac
done
for k in "${KIND_LIST[@]}"; do
  case "$k" in
    dflash|domino|dspark|dflash2) ;;
    *) die "--kinds: unknown kind '$k' (dflash, domino, dspark, dflash2)" ;;
  esac
done
[ -x "$BIN" ] || die "$BIN: no dflash_mpi binary; HINT: cmake --build build --target dflash_mpi, or --bin PATH"
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3  # Debian's python3 has python3-matplotlib
HELP="$ROOT/benchmarks/tau_experiment.py"
command -v mpirun > /dev/null || die "mpirun not found; HINT: bash launch/setup.sh installs Open MPI"
if [ -e "$OUT/results.jsonl" ]; then
  die "$OUT/results.jsonl exists: this experiment was run there; HINT: --out a new directory (nothing is overwritten)"
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export OMPI_MCA_rmaps_base_oversubscribe=1
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
START=$(date +%s)
say() { printf '[%5ds] %s\n' "$(($(date +%s) - START))" "$*"; }

say "prompts: $TRAIN_PROMPTS for training data, $EVAL_PROMPTS held out (seed $SEED) -> $OUT"
"$PY" "$HELP" prompts --out-train "$OUT/prompts_train.jsonl" --out-eval "$OUT/prompts_eval.jsonl" \
  --train "$TRAIN_PROMPTS" --eval "$EVAL_PROMPTS" --seed "$SEED"
"$BIN" data convert --in "$OUT/prompts_train.jsonl" --out "$OUT/prompts_train.h5" --vocab 64 > "$OUT/data.log"
"$BIN" data convert --in "$OUT/prompts_eval.jsonl" --out "$OUT/prompts_eval.h5" --vocab 64 >> "$OUT/data.log"

for t in "${TARGET_LIST[@]}"; do
  T="$OUT/$t"
  mkdir -p "$T"
  "$PY" "$HELP" target "$t" --out "$T/config.json"
  "$BIN" model init --hf-config "$T/config.json" --out "$T/model" --seed "$SEED" > "$T/model_init.log"
  say "$t: the target writes the training responses ($TRAIN_PROMPTS x $GEN_TOKENS tokens, greedy)"
  "$BIN" eval --generate --target "$T/model" --prompts "$OUT/prompts_train.h5" --max-new-tokens "$GEN_TOKENS" \
    --batch 16 --out "$T/train.h5" > "$T/generate.log" 2>&1 || { tail -5 "$T/generate.log"; exit 1; }
  say "$t: $(tail -1 "$T/generate.log")"
  for k in "${KIND_LIST[@]}"; do
    K="$T/$k"
    mkdir -p "$K"
    "$PY" "$HELP" config --kind "$k" --target-dir "$T/model" --data "$T/train.h5" --run-dir "$K/run" \
      --steps "$STEPS" --seed "$SEED" --out "$K/config.toml"
    say "$t / $k: training $STEPS steps (mpirun -np 2: 1 target + 1 drafter rank) -> $K/train.log"
    mpirun -np 2 "$BIN" --config "$K/config.toml" > "$K/train.log" 2>&1 || { tail -20 "$K/train.log"; exit 1; }
    say "$t / $k: $(grep '^step' "$K/train.log" | tail -1 | cut -d'|' -f1-2)"
    say "$t / $k: eval on $EVAL_PROMPTS held-out prompts, $EVAL_TOKENS new tokens each"
    "$BIN" eval --target "$T/model" --config "$K/config.toml" --prompts "$OUT/prompts_eval.h5" \
      --max-new-tokens "$EVAL_TOKENS" --out "$K/eval.jsonl" > "$K/eval.log" 2>&1 || { tail -5 "$K/eval.log"; exit 1; }
    "$PY" "$HELP" record --out-dir "$OUT" --target "$t" --variant "$k" --log "$K/eval.log"
    if [ "$k" = dspark ]; then
      "$BIN" eval --target "$T/model" --config "$K/config.toml" --prompts "$OUT/prompts_eval.h5" \
        --max-new-tokens "$EVAL_TOKENS" --dspark-confidence "$CONFIDENCE" --out "$K/eval_confidence.jsonl" \
        > "$K/eval_confidence.log" 2>&1 || { tail -5 "$K/eval_confidence.log"; exit 1; }
      "$PY" "$HELP" record --out-dir "$OUT" --target "$t" --variant "dspark conf $CONFIDENCE" \
        --log "$K/eval_confidence.log"
    fi
  done
done
say "done: the table ($OUT/results.md) and the plot"
"$PY" "$HELP" table "$OUT"
"$PY" "$HELP" plot "$OUT"
