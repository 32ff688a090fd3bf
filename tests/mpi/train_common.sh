# Shared by the MPI training tests: a tiny corpus and a config writer. Sourced with BIN, SRC, MPIEXEC set.
set -uo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

"$BIN" data synth --out "$TMP/tokens.h5" --vocab 255 --sequences 400 --min-len 24 --max-len 96 --seed 3 >/dev/null ||
  { echo "FAIL: data synth"; exit 1; }

# write_config FILE RUN_DIR TARGETS DRAFTERS MAX_STEPS [extra TOML lines...]
write_config() {
  local f=$1 dir=$2 t=$3 d=$4 steps=$5
  shift 5
  cat >"$f" <<TOML
[run]
dir = "$dir"
seed = 5
log_interval = 1e-6
max_steps = $steps
[target]
random_config = "$SRC/configs/tiny-target.json"
device = "cpu"
[drafter]
layers = 1
heads = 4
kv_heads = 2
head_dim = 16
intermediate = 96
block_size = 8
mask_token_id = 255
target_layer_ids = [1, 3]
num_taps = 2
num_anchors = 4
[data]
train = ["$TMP/tokens.h5"]
token_budget = 256
[train]
lr = 3e-3
warmup_ratio = 0.1
grad_accum = 2
[checkpoint]
interval = 1000
keep_last = 2
[topology]
targets = $t
drafters = $d
TOML
  for line in "$@"; do echo "$line" >>"$f"; done
}

# run_mpi NP LOG args...: runs dflash_mpi under mpirun; returns its exit code.
run_mpi() {
  local np=$1 log=$2
  shift 2
  timeout 300 "$MPIEXEC" --oversubscribe -np "$np" "$BIN" "$@" >"$log" 2>&1
}

# losses FILE: the "loss" of every line of a metrics.jsonl, one per line, full precision.
losses() { python3 -c 'import json,sys; [print(repr(json.loads(l)["loss"])) for l in open(sys.argv[1])]' "$1"; }
