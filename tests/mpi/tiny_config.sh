# The tiny CPU training config the MPI and SLURM tests run: the random tiny target of configs/tiny-target.json,
# a 1-layer drafter, every step logged. Sourced; needs SRC (the source dir).
# tiny_config FILE RUN_DIR TOKENS_H5 TARGETS DRAFTERS MAX_STEPS [extra TOML lines...]
tiny_config() {
  local f=$1 dir=$2 tokens=$3 t=$4 d=$5 steps=$6
  shift 6
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
train = ["$tokens"]
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

# losses FILE: the "loss" of every metric line of a metrics.jsonl, one per line, full precision (the start
# markers, {"event": "start", ...}, have none).
losses() {
  python3 -c 'import json,sys; [print(repr(j["loss"])) for j in map(json.loads, open(sys.argv[1])) if "loss" in j]' "$1"
}
# step_lines FILE: how many metric lines (not start markers) a metrics.jsonl holds.
step_lines() { losses "$1" | wc -l; }
