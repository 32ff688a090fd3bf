#!/usr/bin/env bash
# The demo: install what is missing, build, then train a DFlash drafter on CPU ranks with mpirun:
# 2 target ranks run a random tiny Qwen3.5-style target (configs/tiny-target.json) and stream hidden states
# under credits to 1 drafter rank, which trains a 1-layer drafter on a synthetic corpus (configs/tiny.toml).
# The loss falls and tau (acceptance length) rises as it learns. How long it takes depends on the machine
# (README.md, "The two commands"): the first run also installs packages and builds dflash_mpi.
set -euo pipefail
BUILD_TARGETS=dflash_mpi source "$(dirname "$0")/setup.sh"
cd "$ROOT_DIR"
BIN="$BUILD_DIR/dflash_mpi"
mkdir -p runs/tiny
if [ ! -f runs/tiny/tokens.h5 ]; then
  echo "== synthetic corpus -> runs/tiny/tokens.h5"
  "$BIN" data synth --out runs/tiny/tokens.h5 --vocab 255 --sequences 4000 --min-len 48 --max-len 160 --seed 1
fi
# A fresh run each time: the demo's own checkpoints and metrics from an earlier demo run are removed.
rm -rf runs/tiny/checkpoints runs/tiny/metrics.jsonl
echo "== mpirun -np 3 dflash_mpi --config configs/tiny.toml   (2 targets + 1 drafter, CPU)"
mpirun --oversubscribe -np 3 "$BIN" --config configs/tiny.toml
"$BIN" export --config configs/tiny.toml --out runs/tiny/export --force
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3  # Debian's python3 has python3-matplotlib (setup.sh installs it)
"$PY" launch/plot_metrics.py runs/tiny
echo "== demo done: checkpoints in runs/tiny/checkpoints, metrics in runs/tiny/metrics.jsonl,"
echo "   the drafter as a Hugging Face DFlash model in runs/tiny/export"
"$BIN" model init --hf-config configs/tiny-target.json --out runs/tiny/target --force >/dev/null
echo "   (the same random target as a Hugging Face checkpoint: runs/tiny/target; try"
echo "    $BIN extract --model runs/tiny/target --tokens runs/tiny/tokens.h5 --out runs/tiny/features.h5)"
