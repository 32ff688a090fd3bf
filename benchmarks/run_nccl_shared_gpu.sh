#!/usr/bin/env bash
# The NCCL pipeline on one GPU (the shared-GPU test mode: launch/nccl_hostid.sh gives every rank its own
# NCCL_HOSTID, so NCCL moves the payloads over its socket transport on loopback). Two measurements, both from the
# run's own metrics.jsonl (none of them is an interconnect figure; the ranks time-share the GPU):
#   stream  1 CUDA target + 1 CUDA drafter, Qwen3-8B-shaped random target, batches of one 4096-token sequence,
#           over NCCL and then over MPI: the target's time inside its send path (FeatureSender::send_path_s:
#           packing, the payload's copy issue and post, wire polls; credit waits excluded) as a share of its
#           forward time (tgt_send_share), per transport.
#   7-1     7 CUDA targets + 1 CUDA drafter, 8 processes on the GPU over NCCL, the 8B recipe's drafter
#           (configs/qwen3-8b.toml) on a Qwen3-8B-shaped random target cut to LAYERS layers (default 18: 7 full
#           8B targets do not fit one GPU beside the drafter; the taps follow the DFlash default for that depth),
#           100 steps: per-rank rates, q_hs, and how long the drafter waited for batches.
#   [LOG_DIR=DIR] benchmarks/run_nccl_shared_gpu.sh BUILD_DIR stream|7-1|all [STEPS] [LAYERS]
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build=${1:?BUILD_DIR}
what=${2:-all}
steps=${3:-100}
layers=${4:-18}
bin="$build/dflash_mpi"
mpiexec="${MPIEXEC:-mpirun}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_NVLS_ENABLE=0
[[ -x "$bin" ]] || { echo "run_nccl_shared_gpu: $bin not built" >&2; exit 2; }
tmp=$(mktemp -d)
# LOG_DIR: where the runs' own logs are copied at the end (e.g. a device call's $OUT).
trap 'exit 143' TERM
trap '[ -n "${LOG_DIR:-}" ] && for f in "$tmp"/*.log; do cp "$f" "$LOG_DIR/run-${f##*/}"; done 2>/dev/null; rm -rf "$tmp"' EXIT
"$bin" data synth --out "$tmp/tok.h5" --vocab 151936 --sequences 400 --min-len 4096 --max-len 4096 --seed 5 \
  >/dev/null || { echo "run_nccl_shared_gpu: data synth failed" >&2; exit 1; }
mkdir -p "$tmp/target"
python3 - "$here/tests/fixtures/models/qwen3-8b/config.json" "$tmp/target/config.json" "$layers" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["num_hidden_layers"] = c["max_window_layers"] = int(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
# config NAME TARGETS STEPS TRANSPORT: the 8B recipe on the cut target, one 4096-token sequence per batch.
config() {
  sed -e "s|^dir = .*|dir = \"$tmp/$1\"|" -e "s|^log_interval = .*|log_interval = 1e-6\nmax_steps = $3|" \
    -e "s|^model = .*|random_config = \"$tmp/target\"|" -e "s|^train = .*|train = [\"$tmp/tok.h5\"]|" \
    -e 's|^token_budget = .*|token_budget = 4096|' -e "s|^targets = .*|targets = $2|" \
    -e 's|^interval = 1000|interval = 100000|' -e "s|^hs_queue_depth = .*|hs_queue_depth = 2\ntransport = \"$4\"|" \
    "$here/configs/qwen3-8b.toml" >"$tmp/$1.toml"
}
# run NAME NP PREFIX: the training run; its log into $tmp/NAME.log (tail on failure). Unbound (--bind-to none):
# mpirun would bind each of a few ranks to one core, and the drafter fills its frozen random embedding and
# lm_head (2 x 151,936 x 4096 values) on the host with OpenMP.
run() {
  local name=$1 np=$2 prefix=$3
  local t0=$SECONDS sampler
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 1000 >"$tmp/$name.mem" 2>/dev/null &
  sampler=$!
  # shellcheck disable=SC2086
  if ! timeout 480 "$mpiexec" --oversubscribe --bind-to none -np "$np" $prefix "$bin" --config "$tmp/$name.toml" >"$tmp/$name.log" 2>&1; then
    kill "$sampler" 2>/dev/null
    tail -30 "$tmp/$name.log"; echo "run_nccl_shared_gpu: $name failed" >&2; return 1
  fi
  kill "$sampler" 2>/dev/null
  echo "--- $name: $np ranks, $((SECONDS - t0)) s wall, GPU memory peak $(sort -n "$tmp/$name.mem" | tail -1) MiB"
  grep -E "NCCL over sockets|NCCL [0-9.]+: world|transport (nccl|mpi) " "$tmp/$name.log" | head -3 | cut -c1-220
}
# summary NAME WARM: rates, queue depths and the send path's share from metrics.jsonl, after WARM steps.
summary() {
  python3 - "$tmp/$1/metrics.jsonl" "$2" "$1" <<'PY'
import json, sys
rows = [j for j in map(json.loads, open(sys.argv[1])) if "loss" in j]
warm, name = int(sys.argv[2]), sys.argv[3]
w = rows[warm:]
mean = lambda k: sum(r[k] for r in w) / len(w)
per = lambda k: [round(sum(r[k][i] for r in w) / len(w), 3) for i in range(len(w[0][k]))]
span = w[-1]["elapsed_s"] - rows[warm - 1]["elapsed_s"]
starved = sum(1 for r in w if r["q_hs"] < 1)
# grad_accum is 1: a step is one batch, so 1 / the drafter's busy rate is its busy time per step; the rest of
# the step it waited for a batch (on the wire, or for a target that the time-shared GPU had not yet served).
busy = sum(1 / r["dft_rank_batches_s"][0] for r in w if r["dft_rank_batches_s"][0] > 0) / len(w)
out = {"bench": "run_nccl_shared_gpu", "run": name, "steps": len(rows), "warmup_steps": warm,
       "s_per_step": span / len(w), "drafter_busy_share": busy / (span / len(w)), "tgt_send_share": mean("tgt_send_share"), "q_hs": mean("q_hs"),
       "q_pre": mean("q_pre"), "steps_with_q_hs_below_1": starved,
       "tgt_rank_batches_s": per("tgt_rank_batches_s"), "dft_rank_batches_s": per("dft_rank_batches_s"),
       "tgt_rank_send_share": per("tgt_rank_send_share"), "loss_first": rows[0]["loss"], "loss_last": rows[-1]["loss"]}
print(f"{name}: {out['s_per_step']:.3f} s/step over steps {warm + 1}..{len(rows)}; target send path "
      f"{out['tgt_send_share']:.2%} of its forward time; q_hs {out['q_hs']:.2f} (steps with no batch waiting: "
      f"{starved} of {len(w)}), q_pre {out['q_pre']:.2f}; the drafter busy {out['drafter_busy_share']:.1%} of each step")
print(f"{name}: per-target busy rates (b/s) {out['tgt_rank_batches_s']}; drafter {out['dft_rank_batches_s']}; "
      f"per-target send share {out['tgt_rank_send_share']}")
print(json.dumps(out))
PY
}
rc=0
if [[ $what == stream || $what == all ]]; then
  echo "=== stream: 1 CUDA target + 1 CUDA drafter on one GPU, $layers-layer Qwen3-8B-shaped target, 40 steps"
  config stream-nccl 1 40 nccl && run stream-nccl 2 "$here/launch/nccl_hostid.sh" && summary stream-nccl 8 || rc=1
  config stream-mpi 1 40 mpi && run stream-mpi 2 "" && summary stream-mpi 8 || rc=1
fi
if [[ $what == 7-1 || $what == all ]]; then
  echo "=== 7-1: 7 CUDA targets + 1 CUDA drafter, 8 processes on one GPU over NCCL, $steps steps"
  config seven 7 "$steps" nccl && run seven 8 "$here/launch/nccl_hostid.sh" && summary seven 10 || rc=1
fi
exit $rc
